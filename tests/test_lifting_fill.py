"""rh3dgs.lifting.fill: the bilateral neighbour vote that gives unobserved Gaussians a feature."""
import torch

from rh3dgs.lifting.fill import fill_from_neighbours


def _explicit(means, colors, feats, observed, sigma_c, radius, conf):
    """Every unobserved Gaussian: normalize(sum over observed j within radius of q_j exp(-dc^2/2sc^2 - d^2/2(r/2)^2) f_j)."""
    out = feats.clone()
    for i in torch.nonzero(~observed).flatten().tolist():
        acc = torch.zeros(feats.shape[1], dtype=torch.float64)
        for j in torch.nonzero(observed).flatten().tolist():
            d = float((means[i] - means[j]).norm())
            if d <= radius:
                dc2 = float(((colors[i] - colors[j]) ** 2).sum())
                acc += float(conf[j]) * torch.exp(torch.tensor(-dc2 / (2 * sigma_c ** 2) - d * d / (2 * (radius / 2) ** 2))) * feats[j].double()
        out[i] = torch.nn.functional.normalize(acc, dim=0).float()
    return out


def test_fill_matches_the_explicit_vote_with_confidence():
    g = torch.Generator().manual_seed(0)
    means = torch.rand(60, 3, generator=g)
    colors = torch.rand(60, 3, generator=g) * 0.2
    feats = torch.nn.functional.normalize(torch.randn(60, 5, generator=g), dim=-1)
    observed = torch.rand(60, generator=g) > 0.3
    conf = torch.rand(60, generator=g) ** 2 + 0.01
    out, filled = fill_from_neighbours(means, colors, feats, observed, k=64, color_sigma=0.1, radius=0.5, confidence=conf)
    ref = _explicit(means, colors, feats, observed, 0.1, 0.5, conf)
    assert torch.equal(out[observed], feats[observed])
    assert bool(filled[~observed].all()) and not bool(filled[observed].any())
    assert torch.allclose(out[filled], ref[filled], atol=1e-5)


def test_a_neighbour_seen_through_an_occluder_votes_less():
    """Two observed neighbours, same distance and colour: the one with visibility 0.1 (squared: 0.01) barely counts."""
    means = torch.tensor([[0.0, 0, 0], [0.1, 0, 0], [-0.1, 0, 0]])
    colors = torch.zeros(3, 3)
    feats = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    observed = torch.tensor([False, True, True])
    even, _ = fill_from_neighbours(means, colors, feats, observed, k=2, radius=1.0)
    assert torch.allclose(even[0], torch.tensor([0.7071, 0.7071]), atol=1e-4)
    vis = torch.tensor([1.0, 1.0, 0.1])
    out, _ = fill_from_neighbours(means, colors, feats, observed, k=2, radius=1.0, confidence=vis ** 2)
    assert float(out[0, 0]) > 0.9999 and float(out[0, 1]) < 0.011
