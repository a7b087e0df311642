"""rh3dgs.method.lic: radius graph, spherical k-means pseudo-instances, the LIC contrastive loss."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rh3dgs.errors import ConfigError, ShapeError
from rh3dgs.method.lic import LICConfig, LICLoss, pseudo_instances, radius_graph, spherical_kmeans


def brute_force_graph(pts: np.ndarray, radius: float, cap: int) -> list:
    d = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1))
    rows = []
    for i in range(len(pts)):
        js = [j for j in np.argsort(d[i], kind="stable") if j != i and d[i, j] <= radius]
        rows.append(js[:cap])
    return rows


def test_radius_graph_matches_brute_force():
    rng = np.random.default_rng(0)
    pts = rng.random((500, 3)).astype(np.float32)
    radius, cap = 0.15, 8
    nbr = radius_graph(torch.from_numpy(pts), radius, cap)
    assert nbr.shape == (500, cap) and nbr.dtype == torch.long
    ref = brute_force_graph(pts.astype(np.float64), radius, cap)
    capped = 0
    for i, js in enumerate(ref):
        got = [j for j in nbr[i].tolist() if j >= 0]
        assert got == js  # same set, same (distance) order
        assert all(j == -1 for j in nbr[i].tolist()[len(got):])  # padding at the end only
        capped += len(js) == cap
    assert capped > 50  # the cap (nearest ones kept) is exercised
    assert any(len(js) < cap for js in ref)


def test_radius_graph_boundary_duplicates_and_small_inputs():
    pts = torch.tensor([[0.5, 0.5, 0.5], [0.75, 0.5, 0.5], [0.5, 0.5, 0.5], [2.0, 2.0, 2.0]], dtype=torch.float64)
    nbr = radius_graph(pts, 0.25, 5)
    # distance exactly == radius is included; a duplicate is a neighbour, the point itself is not
    assert set(nbr[0].tolist()) - {-1} == {1, 2}
    assert set(nbr[2].tolist()) - {-1} == {0, 1}
    assert nbr[3].tolist() == [-1] * 5
    assert radius_graph(pts[:1], 0.25, 3).tolist() == [[-1, -1, -1]]
    with pytest.raises(ConfigError):
        radius_graph(pts, 0.0, 3)
    with pytest.raises(ShapeError):
        radius_graph(pts[0], 0.1, 3)


def purity(labels: torch.Tensor, truth: torch.Tensor) -> float:
    """Fraction of points whose label's majority truth class equals their truth class."""
    ok = 0
    for lab in labels.unique():
        m = labels == lab
        ok += int(torch.bincount(truth[m]).max())
    return ok / labels.numel()


def test_spherical_kmeans_recovers_three_clusters_deterministically():
    g = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(3, 16, generator=g), dim=-1)
    truth = torch.arange(300) % 3
    x = centres[truth] + 0.1 * torch.randn(300, 16, generator=g)
    x = x * (0.5 + torch.rand(300, 1, generator=g))  # norms must not matter
    labels, C = spherical_kmeans(x, 3, seed=1)
    assert purity(labels, truth) == 1.0 and labels.unique().numel() == 3
    assert torch.allclose(C.norm(dim=-1), torch.ones(3), atol=1e-5)
    # every centre is within a few degrees of a true centre
    assert float((C @ centres.T).max(1).values.min()) > math.cos(math.radians(10))
    again = pseudo_instances(x, 3, seed=1)
    assert torch.equal(again, labels)
    other = pseudo_instances(x, 3, seed=7)
    assert purity(other, truth) == 1.0
    # more clusters than points is clipped
    lab_small, C_small = spherical_kmeans(x[:2], 5)
    assert C_small.shape == (2, 16) and lab_small.shape == (2,)


def test_pseudo_instances_can_use_positions():
    g = torch.Generator().manual_seed(0)
    feats = torch.nn.functional.normalize(torch.ones(200, 8) + 0.01 * torch.randn(200, 8, generator=g), dim=-1)
    truth = (torch.arange(200) >= 100).long()
    pos = torch.randn(200, 3, generator=g) * 0.1 + truth[:, None] * torch.tensor([5.0, 0.0, 0.0])
    lab = pseudo_instances(feats, 2, seed=0, positions=pos, position_weight=1.0)
    assert purity(lab, truth) == 1.0


def toy_scene(seed: int = 0, n: int = 200):
    """Two adjacent boxes (instances) of points with noisy 8-D features around two directions."""
    g = torch.Generator().manual_seed(seed)
    box = torch.tensor([1.0, 1.0, 0.2])
    p0 = torch.rand(n, 3, generator=g) * box
    p1 = torch.rand(n, 3, generator=g) * box + torch.tensor([1.0, 0.0, 0.0])
    means = torch.cat([p0, p1])
    inst = torch.cat([torch.zeros(n), torch.ones(n)]).long()
    c = torch.nn.functional.normalize(torch.randn(2, 8, generator=g), dim=-1)
    feats = c[inst] + 0.35 * torch.randn(2 * n, 8, generator=g)
    return means, feats, inst


def neighbour_cosines(feats: torch.Tensor, nbr: torch.Tensor, inst: torch.Tensor) -> tuple:
    f = torch.nn.functional.normalize(feats, dim=-1)
    valid = nbr >= 0
    j = nbr.clamp_min(0)
    cs = (f[:, None, :] * f[j]).sum(-1)
    same = valid & (inst[j] == inst[:, None])
    return float(cs[same].mean()), float(cs[valid & ~same].mean())


def test_loss_decreases_and_same_instance_neighbours_align():
    means, feats0, inst = toy_scene()
    cfg = LICConfig(radius=0.2, max_neighbors=16, num_anchors=128, num_random_negatives=32, temperature=0.1,
                    num_clusters=2, warmup_steps=0, refresh_every=10**9, seed=0)
    lic = LICLoss(cfg)
    assert lic.maybe_refresh(0, means, feats0)
    assert purity(lic.labels, inst) > 0.95
    f = torch.nn.Parameter(feats0.clone())
    opt = torch.optim.Adam([f], lr=0.02)
    hist = []
    for step in range(120):
        loss = lic(f, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        hist.append(float(loss.detach()))
    assert np.mean(hist[-10:]) < 0.85 * np.mean(hist[:10])
    nbr = radius_graph(means, 0.2, 16)
    same0, cross0 = neighbour_cosines(feats0, nbr, inst)
    same1, cross1 = neighbour_cosines(f.detach(), nbr, inst)
    assert same1 > same0 + 0.2
    assert cross1 < cross0


def test_loss_value_by_hand():
    means = torch.tensor([[0.0, 0, 0], [0.1, 0, 0], [0.2, 0, 0]])
    feats = torch.tensor([[1.0, 0.0], [math.cos(0.3), math.sin(0.3)], [0.0, 1.0]], requires_grad=True)
    cfg = LICConfig(radius=0.25, max_neighbors=4, num_anchors=10, num_random_negatives=0, temperature=0.5,
                    num_clusters=2, warmup_steps=0)
    lic = LICLoss(cfg)
    lic.refresh(means, feats)
    assert lic.labels[0] == lic.labels[1] != lic.labels[2]
    assert sorted(lic.eligible.tolist()) == [0, 1]  # point 2 has no positive: never an anchor
    f = torch.nn.functional.normalize(feats.detach(), dim=-1)
    s = (f @ f.T) / 0.5
    l0 = -math.log(math.exp(s[0, 1]) / (math.exp(s[0, 1]) + math.exp(s[0, 2])))
    l1 = -math.log(math.exp(s[1, 0]) / (math.exp(s[1, 0]) + math.exp(s[1, 2])))
    assert float(lic(feats, 0).detach()) == pytest.approx((l0 + l1) / 2, rel=1e-5)


def test_warmup_gating_and_refresh_rules():
    means, feats, _ = toy_scene(n=50)
    cfg = LICConfig(radius=0.3, num_clusters=2, warmup_steps=100, refresh_every=10)
    lic = LICLoss(cfg)
    f = feats.clone().requires_grad_(True)
    out = lic(f, 99, means=means)
    assert out.item() == 0.0 and out.dim() == 0
    out.backward()
    assert torch.equal(f.grad, torch.zeros_like(f))
    assert lic.nbr_idx is None and not lic.maybe_refresh(99, means, feats)
    # after warm-up: no graph yet -> clear error, then refresh on schedule
    with pytest.raises(ConfigError):
        lic(f, 100)
    assert lic.maybe_refresh(100, means, feats)
    assert not lic.maybe_refresh(105, means, feats)
    assert lic.maybe_refresh(110, means, feats)
    assert float(lic(f, 111).detach()) > 0
    # densification changes N: error without means, refresh with them
    more_means, more_feats = torch.cat([means, means[:5] + 0.01]), torch.cat([feats, feats[:5]])
    with pytest.raises(ShapeError):
        lic(more_feats, 112)
    assert float(lic(more_feats, 112, means=more_means).detach()) > 0
    assert lic.nbr_idx.shape[0] == 105


def test_isolated_points_give_zero_loss():
    means = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 3)  # far apart
    feats = torch.randn(10, 4, requires_grad=True)
    lic = LICLoss(LICConfig(radius=0.5, num_clusters=2, warmup_steps=0))
    out = lic(feats, 0, means=means)
    assert out.item() == 0.0 and lic.eligible.numel() == 0
    out.backward()
    assert torch.equal(feats.grad, torch.zeros_like(feats))


def test_native_loss_matches_the_torch_formula():
    """float32 features run the native op, float64 ones its torch reference: same loss and gradient."""
    means, feats, _ = toy_scene(n=300)
    cfg = LICConfig(radius=0.2, num_anchors=256, num_random_negatives=32, num_clusters=2, warmup_steps=0)
    outs = []
    for dtype in (torch.float32, torch.float64):
        lic = LICLoss(cfg)
        lic.refresh(means, feats)
        f = feats.detach().to(dtype).clone().requires_grad_(True)
        loss = lic(f, 0)
        loss.backward()
        outs.append((float(loss.detach()), f.grad.double()))
    assert outs[0][0] == pytest.approx(outs[1][0], rel=1e-5)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-6, rtol=1e-4)


def test_centred_lic_is_lic_of_the_centred_features():
    """``centered``: the loss (and its gradient) equals the paper's LIC on normalize(normalize(f) - mean), the mean
    direction taken at the refresh; pseudo-instances are clustered on those centred features too."""
    means, feats0, _ = toy_scene()
    common = torch.nn.functional.normalize(torch.ones(feats0.shape[1]), dim=0)
    f = torch.nn.functional.normalize(feats0 + 3.0 * common, dim=-1)  # a strong shared direction (CLIP-like cone)
    kw = dict(radius=0.2, max_neighbors=16, num_anchors=64, num_random_negatives=16, num_clusters=2,
              warmup_steps=0, refresh_every=10**9, seed=3)
    centred = LICLoss(LICConfig(centered=True, **kw))
    centred.refresh(means, f)
    c = torch.nn.functional.normalize(f, dim=-1).mean(0)
    assert torch.allclose(centred.center, c)
    plain = LICLoss(LICConfig(**kw))
    g = torch.nn.functional.normalize(f - c, dim=-1)
    plain.refresh(means, g)
    assert torch.equal(centred.labels, plain.labels)
    x = f.clone().requires_grad_(True)
    y = torch.nn.functional.normalize(torch.nn.functional.normalize(x, dim=-1) - c, dim=-1)
    a, b = centred(x, 1), plain(y, 1)
    assert float(a) == pytest.approx(float(b), rel=1e-6) and float(a) > 0
    ga, = torch.autograd.grad(a, x)
    gb, = torch.autograd.grad(b, x)
    assert torch.allclose(ga, gb, atol=1e-6)
    # the cone no longer dominates the cosines the contrast sees
    assert float((f[:50] @ f[50:].T).mean()) > 0.8 and float((g[:50] @ g[50:].T).mean()) < 0.5


def _appearance_scene(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(n, 3, generator=g)
    colors = torch.where(torch.rand(n, 1, generator=g) < 0.5, torch.tensor([0.8, 0.1, 0.1]), torch.tensor([0.1, 0.1, 0.8]))
    colors = colors + 0.03 * torch.randn(n, 3, generator=g)
    feats = torch.randn(n, 8, generator=g)
    return means, colors, feats


def test_appearance_positives_are_the_neighbours_of_similar_colour():
    means, colors, feats = _appearance_scene()
    cfg = LICConfig(positives="appearance", color_threshold=0.15, radius=0.2, max_neighbors=12, warmup_steps=0)
    lic = LICLoss(cfg)
    lic.refresh(means, feats, colors=colors)
    ref = brute_force_graph(means.double().numpy(), 0.2, 12)
    for i in range(0, 300, 7):
        got = {int(j) for j, p in zip(lic.nbr_idx[i], lic.positive[i]) if p}
        want = {j for j in ref[i] if float((colors[j] - colors[i]).norm()) < 0.15}
        assert got == want
    assert lic.labels is None and set(lic.eligible.tolist()) == {i for i in range(300) if lic.positive[i].any()}
    # random negatives never share the anchor's appearance
    a = torch.arange(10)
    same = lic._same_instance(a, torch.arange(300).expand(10, -1))
    assert torch.equal(same, (colors[None] - colors[a][:, None]).norm(dim=-1) < 0.15)
    with pytest.raises(ConfigError, match="colours"):
        LICLoss(cfg).refresh(means, feats)
    with pytest.raises(ConfigError, match="positives"):
        LICConfig(positives="colour")
    with pytest.raises(ConfigError, match="form"):
        LICConfig(form="push")


def test_pull_form_matches_the_mean_over_positives_values_and_gradients():
    means, colors, feats = _appearance_scene(200, 1)
    cfg = LICConfig(positives="appearance", form="pull", color_threshold=0.15, radius=0.25, max_neighbors=10,
                    num_anchors=10_000, warmup_steps=0)
    lic = LICLoss(cfg)
    x = feats.double().requires_grad_(True)
    loss = lic(x, 0, means=means, colors=colors)
    y = feats.double().requires_grad_(True)
    u = torch.nn.functional.normalize(y, dim=-1)
    terms = []
    for a in lic.eligible.tolist():
        ps = [int(j) for j, p in zip(lic.nbr_idx[a], lic.positive[a]) if p]
        terms.append(torch.stack([1.0 - (u[a] * u[j]).sum() for j in ps]).mean())
    ref = torch.stack(terms).mean()
    assert float(loss) == pytest.approx(float(ref), rel=1e-10) and float(ref) > 0.1
    loss.backward()
    ref.backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-9, atol=1e-12)


def test_pull_form_makes_same_colour_neighbours_agree():
    means, colors, feats = _appearance_scene(300, 2)
    lic = LICLoss(LICConfig(positives="appearance", form="pull", color_threshold=0.15, radius=0.2,
                            num_anchors=512, warmup_steps=0))
    x = feats.clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    first = None
    for step in range(150):
        opt.zero_grad()
        loss = lic(x, step, means=means, colors=colors)
        first = float(loss) if first is None else first
        loss.backward()
        opt.step()
    final = float(lic(x.detach(), 0, means=means, colors=colors))
    assert first > 0.5 and final < 0.05 * first
