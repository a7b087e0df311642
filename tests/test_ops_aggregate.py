"""Native per-Gaussian spherical aggregation vs explicit enumeration of all contributions.

The traversal op runs on every device present (CUDA: csrc/cuda/aggregate.cu, per-Gaussian sums by atomics, held to
the same reference and bounds: float32 sums of a few hundred terms of size <= 2, in any order, are within 1e-4); the
recording and its replay are CPU ops (the lift replays only on CPU).
"""
import math

import pytest
import torch

from _scenes import on_device, random_projected
from rh3dgs.errors import ShapeError
from rh3dgs.ops import aggregate_sphere
from rh3dgs.ops._ref import _ref_aggregate_sphere


def _inputs(B=2, N=70, D=12, W=40, H=31, seed=0):
    s = random_projected(B, N, 1, W, H, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    feats = torch.nn.functional.normalize(torch.randn(B, H, W, D, generator=g), dim=-1)
    weights = torch.rand(B, H, W, generator=g) * 2
    weights[:, :3] = 0  # some pixels switched off
    mu = torch.nn.functional.normalize(torch.randn(N, D, generator=g), dim=-1)
    return s, feats, weights, mu


@pytest.mark.parametrize("D", [12, 128])  # the generic kernel; the compiled one of the CLIP-sized lift's subspace
@pytest.mark.parametrize("mode,delta", [("init", math.inf), ("irls", math.inf), ("irls", 0.3), ("irls", 1e-3)])
def test_aggregate_matches_enumeration(mode, delta, D, device):
    s, feats, weights, mu = _inputs(D=D)
    args = (s["means2d"], s["conics"], s["opacities"], feats, weights)
    nat = aggregate_sphere(*on_device(args, device), s["isect_offsets"].to(device), s["flatten_ids"].to(device),
                           s["tile_size"], mu=mu.to(device), delta=delta, mode=mode)
    nat = on_device(nat, "cpu")
    ref = _ref_aggregate_sphere(*args, mu, delta, 0 if mode == "init" else 1, s["tile_size"], s["isect_offsets"],
                                s["flatten_ids"])
    for a, b, name in zip(nat, ref, ("acc_w", "acc_v", "acc_raw")):
        assert (a - b).abs().max() <= 1e-4, name
    assert ref[2].max() > 1.0 and (ref[2] > 0).sum() > 30  # many Gaussians received contributions
    if mode == "irls":
        # tangent vectors are orthogonal to mu
        assert (nat[1] * mu).sum(-1).abs().max() < 1e-4


def test_one_irls_step_moves_toward_the_data(device):
    """Single Gaussian covering a pixel patch whose features all equal a target v: the mean converges to v."""
    s, _, weights, _ = _inputs(B=1, N=70, D=6, seed=4)
    target = torch.nn.functional.normalize(torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 0.3]), dim=0).to(device)
    feats = target.expand(1, 31, 40, 6).contiguous()
    args = (*on_device((s["means2d"], s["conics"], s["opacities"]), device), feats,
            torch.ones(1, 31, 40, device=device), *on_device((s["isect_offsets"], s["flatten_ids"]), device),
            s["tile_size"])
    w, v, raw = aggregate_sphere(*args, mode="init")
    mu = torch.nn.functional.normalize(v, dim=-1)
    hit = raw > 0
    torch.testing.assert_close(mu[hit], target.expand(int(hit.sum()), 6), atol=1e-5, rtol=0)
    w2, t2, _ = aggregate_sphere(*args, mu=mu, delta=0.1, mode="irls")
    assert t2[hit].norm(dim=-1).max() < 1e-3  # already at the mean: zero tangent step


def _recorded(s, channels=1):
    """The rasterizer's forward of the scene with recording, and the plain forward."""
    from rh3dgs.ops import rasterize_to_pixels

    feats = s["features"][..., :channels].contiguous()
    args = (s["means2d"], s["conics"], feats, s["opacities"], s["depths"], s["width"], s["height"], s["tile_size"],
            s["isect_offsets"], s["flatten_ids"])
    return rasterize_to_pixels(*args, record=True), rasterize_to_pixels(*args)


@pytest.mark.parametrize("D", [8, 12, 64, 128])
def test_recorded_contributions_replay_the_traversal(D):
    """A recording forward gives the plain forward's outputs bit for bit and one record per contribution;
    replaying the record with any maps, pixel weights and mu equals a traversal (bit-identical for the
    compiled channel counts 8, 64 and 128; float rounding for the generic kernel)."""
    from rh3dgs.ops import aggregate_sphere_replay

    s = random_projected(2, 70, 3, 40, 31, seed=0)
    out, plain = _recorded(s, channels=3)
    for name in ("render", "alpha", "d1", "d2"):
        assert torch.equal(getattr(out, name), getattr(plain, name)), name
    rec = out.contributions
    g = torch.Generator().manual_seed(7)
    feats = torch.nn.functional.normalize(torch.randn(2, 31, 40, D, generator=g), dim=-1)
    mu = torch.nn.functional.normalize(torch.randn(70, D, generator=g), dim=-1)
    weights = torch.rand(2, 31, 40, generator=g) * 2
    weights[:, :3] = 0  # some pixels switched off
    weights[0, 5, 7] = float("nan")  # ... and a NaN one: the traversal skips it
    args = (s["means2d"], s["conics"], s["opacities"], feats, weights, s["isect_offsets"], s["flatten_ids"],
            s["tile_size"])
    # one record per contribution of the enumeration; per pixel they sum to the forward's alpha
    ref = _ref_aggregate_sphere(s["means2d"], s["conics"], s["opacities"], feats, torch.ones(2, 31, 40), mu,
                                math.inf, 0, s["tile_size"], s["isect_offsets"], s["flatten_ids"])
    assert rec.weights.numel() > 1000 and (rec.weights > 0).all() and (rec.masses >= rec.weights).all()
    torch.testing.assert_close(torch.zeros(70).index_add_(0, rec.gaussian_ids(), rec.weights), ref[0],
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.zeros(2 * 31 * 40).index_add_(0, rec.pixels(), rec.weights),
                               out.alpha.flatten(), atol=1e-5, rtol=0)
    for mode, delta in (("init", math.inf), ("irls", math.inf), ("irls", 0.3)):
        trav = aggregate_sphere(*args, mu=mu, delta=delta, mode=mode)
        rep = aggregate_sphere_replay(rec, feats, weights, mu, delta, mode)
        for a, b in zip(trav, rep):
            if D in (8, 64, 128):
                assert torch.equal(a, b), (mode, delta)
            else:
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # active: the inactive Gaussians' sums are 0, the active ones' the same bits
    active = torch.rand(70, generator=g) < 0.5
    full = aggregate_sphere_replay(rec, feats, weights, mu, 0.3, "irls")
    part = aggregate_sphere_replay(rec, feats, weights, mu, 0.3, "irls", active=active)
    for a, b in zip(full, part):
        assert torch.equal(a[active], b[active]) and not b[~active].any()
    # the record is one list per tile: replayed with another thread count it sums as that many threads traverse
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            for a, b in zip(aggregate_sphere(*args, mu=mu, delta=0.3, mode="irls"),
                            aggregate_sphere_replay(rec, feats, weights, mu, 0.3, "irls")):
                assert torch.equal(a, b) if D in (8, 64, 128) else torch.allclose(a, b, atol=1e-6, rtol=1e-6), n
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ShapeError):
        aggregate_sphere_replay(rec, feats, weights, mu, 0.3, "irls", active=active[:10])
    assert rec.image_shape == (2, 31, 40)
    for f, w in ((feats, weights[:, :, :20]), (feats[:1], weights[:1]), (feats.transpose(1, 2), weights.transpose(1, 2))):
        with pytest.raises(ShapeError, match="recorded on"):  # maps of another render than the recorded one
            aggregate_sphere_replay(rec, f, w, mu, 0.3, "irls")
    with pytest.raises(RuntimeError, match="larger render"):  # the op's own guard, called directly
        torch.ops.rh3dgs.aggregate_sphere_replay([rec.seg_offsets], [rec.pair_offsets], [rec.segments], [rec.lanes],
                                                 [rec.weights], [rec.masses], [feats[:1].contiguous()],
                                                 [weights[:1].contiguous()], mu, 0.3, 1, None)


@pytest.mark.parametrize("D", [12, 64])
def test_replay_of_several_recordings_is_the_sum_of_their_passes(D):
    """Recordings of different views replayed in one call: the sum of their separate replays (each thread's sums
    added over the recordings first: equal up to that order), with `active` and the shape checks per recording."""
    from rh3dgs.ops import aggregate_sphere_replay

    g = torch.Generator().manual_seed(3)
    parts = []
    for b, seed in ((2, 0), (1, 1), (3, 2)):  # three renders of the same 70 Gaussians, 1-3 views each
        s = random_projected(b, 70, 3, 40, 31, seed=seed)
        rec = _recorded(s, channels=3)[0].contributions
        feats = torch.nn.functional.normalize(torch.randn(b, 31, 40, D, generator=g), dim=-1)
        parts.append((rec, feats, torch.rand(b, 31, 40, generator=g)))
    mu = torch.nn.functional.normalize(torch.randn(70, D, generator=g), dim=-1)
    active = torch.rand(70, generator=g) < 0.7
    recs, feats, weights = (list(x) for x in zip(*parts))
    for mode, delta, act in (("init", math.inf, None), ("irls", 0.3, None), ("irls", 0.3, active)):
        both = aggregate_sphere_replay(recs, feats, weights, mu, delta, mode, act)
        each = [aggregate_sphere_replay(r, f, w, mu, delta, mode, act) for r, f, w in parts]
        for k, got in enumerate(both):
            torch.testing.assert_close(got, sum(e[k] for e in each), rtol=1e-6, atol=1e-6)
        assert both[0].gt(0).sum() > 30 and (act is None or not both[1][~act].any())
    # one recording in a list: its own replay, bit for bit
    for a, b in zip(aggregate_sphere_replay(recs[:1], feats[:1], weights[:1], mu, 0.3, "irls"),
                    aggregate_sphere_replay(recs[0], feats[0], weights[0], mu, 0.3, "irls")):
        assert torch.equal(a, b)
    with pytest.raises(ShapeError, match="recorded on"):  # each recording's maps are checked against it
        aggregate_sphere_replay(recs, [feats[0], feats[0], feats[2]], weights, mu, 0.3, "irls")
    with pytest.raises(ShapeError, match="as many"):
        aggregate_sphere_replay(recs, feats[:2], weights, mu, 0.3, "irls")
