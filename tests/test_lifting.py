"""Training-free lift vs an independent computation: enumerate every (view, pixel, Gaussian)
contribution with the torch reference, then take the robust Frechet mean per Gaussian."""
import math

import pytest
import torch

from _scenes import on_device, random_lift_scene
from rh3dgs.errors import ConfigError, NonFiniteError
from rh3dgs.lifting import LiftConfig, lift
from rh3dgs.ops._ref import _ref_tile_contributions
from rh3dgs.rendering import render
from rh3dgs.method.sphere import geodesic_distance, robust_frechet_mean
from rh3dgs.teachers.maps import region_fraction
from rh3dgs.method.vcd import pixel_weights


def _scene(n=300, views=4, size=40, D=8, seed=0):
    return random_lift_scene(n, views, size, D, seed)


def _explicit(gs, cams, maps, cfg):
    """Per-Gaussian samples (z, weight) by enumeration, then sphere.robust_frechet_mean."""
    H = W = cams.width
    up = torch.nn.functional.normalize(torch.nn.functional.interpolate(
        maps.permute(0, 3, 1, 2), size=(H, W), mode="bilinear", align_corners=False).permute(0, 2, 3, 1), dim=-1)
    zs, ws, segs = [], [], []
    for v in range(len(cams)):
        r = render(gs, cams[v], torch.ones(len(gs), 1), rgb=cfg.guided)
        if cfg.guided and maps.shape[1:3] != (H, W):  # LiftConfig.guided: the map upsampled guided by the colours
            from rh3dgs.teachers.maps import guided_upsample

            up[v] = guided_upsample(torch.nn.functional.normalize(maps[v], dim=-1), r.rgb[0], cfg.guide_sigma_color)
        footprint = W / maps.shape[2] if cfg.teacher_footprint is None else cfg.teacher_footprint
        regions = region_fraction(maps[v], (H, W))[None] if cfg.vcd.segment_power > 0 else None  # the maps as given
        wbar = pixel_weights(r.alpha, r.d1, r.d2, up[v:v + 1], use_vcd=cfg.use_vcd, vcd=cfg.vcd,
                             min_coverage=cfg.min_coverage, footprint=footprint, region_fraction=regions)
        p = r.projection
        for _, pix, ids, w, _ in _ref_tile_contributions(p.means2d, p.conics, p.opacities, W, H, p.tile_size,
                                                         p.isect_offsets, p.flatten_ids):
            w = w * wbar[0].reshape(-1)[pix][:, None]
            pi, ki = torch.nonzero(w > 0, as_tuple=True)
            zs.append(up[v].reshape(-1, up.shape[-1])[pix[pi]])
            ws.append(w[pi, ki])
            segs.append(ids[ki] % len(gs))
    z, w, seg = torch.cat(zs).double(), torch.cat(ws).double(), torch.cat(segs)
    delta = cfg.delta if cfg.method == "robust" else math.inf
    if cfg.method == "euclidean":
        mu = torch.zeros(len(gs), z.shape[1], dtype=torch.float64).index_add_(0, seg, w[:, None] * z)
        mu = torch.nn.functional.normalize(mu, dim=-1)
    else:
        mu, _ = robust_frechet_mean(z, w, seg, len(gs), delta=delta, max_iters=200, tol=1e-10, differentiable=False)
    weight = torch.zeros(len(gs), dtype=torch.float64).index_add_(0, seg, w)
    return mu.float(), weight.float()


@pytest.mark.parametrize("method,use_vcd", [("robust", True), ("karcher", True), ("euclidean", True), ("robust", False)])
def test_lift_matches_explicit_frechet_mean(method, use_vcd, device):
    """The lift on each device present (CPU: recorded contributions replayed; CUDA: the aggregation kernel's traversal
    with atomics) against the enumeration on CPU."""
    gs, cams, maps = _scene()
    cfg = LiftConfig(method=method, use_vcd=use_vcd, iters=60, tol=1e-6, tol_quantile=1.0, views_per_batch=3, latent_dim=4)
    res = lift(gs.to(device), cams.to(device), maps.to(device), cfg, progress=False)
    res = on_device(res, "cpu")
    mu, weight = _explicit(gs, cams, maps, cfg)
    torch.testing.assert_close(res.weight, weight, atol=1e-4, rtol=1e-4)
    ok = res.valid & (weight > 1e-3)
    assert ok.sum() > 100
    ang = geodesic_distance(res.features[ok].double(), mu[ok].double())
    assert ang.max() < 2e-3, float(ang.max())  # radians
    assert torch.allclose(res.features[ok].norm(dim=-1), torch.ones(int(ok.sum())), atol=1e-5)
    # PCA decoder: orthonormal columns, decoding reproduces the features' projection
    torch.testing.assert_close(res.decoder.T @ res.decoder, torch.eye(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(res.latents, res.features @ res.decoder)


def test_lift_of_mask_maps_matches_explicit_frechet_mean_with_mask_specificity():
    """A mask teacher (piecewise-constant maps at the image's resolution, masks of unequal size): the lift's
    pixel weights carry VCD's mask-specificity term, and the lift still equals the explicit robust mean."""
    from rh3dgs.method.vcd import VCDConfig

    gs, cams, _ = _scene()
    g = torch.Generator().manual_seed(3)
    H = W = cams.width
    maps = []
    for v in range(len(cams)):  # per view, 7 Voronoi masks with random embeddings
        seeds = torch.rand(7, 2, generator=g) * H
        yy, xx = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
        owner = ((torch.stack([yy, xx], -1)[:, :, None] - seeds) ** 2).sum(-1).argmin(-1)
        maps.append(torch.nn.functional.normalize(torch.randn(7, 8, generator=g) + 1.5, dim=-1)[owner])
    maps = torch.stack(maps)
    cfg = LiftConfig(iters=300, tol=1e-7, tol_quantile=1.0, views_per_batch=3, latent_dim=4)
    assert cfg.vcd.segment_power > 0  # the default
    res = lift(gs, cams, maps, cfg, progress=False)
    mu, weight = _explicit(gs, cams, maps, cfg)
    torch.testing.assert_close(res.weight, weight, atol=1e-4, rtol=1e-4)
    ok = res.valid & (weight > 1e-3)
    assert ok.sum() > 100
    assert geodesic_distance(res.features[ok].double(), mu[ok].double()).max() < 2e-3
    off = lift(gs, cams, maps, LiftConfig(**{**cfg.__dict__, "vcd": VCDConfig.rh3dgs(segment_power=0.0)}),
               progress=False)
    assert float(geodesic_distance(off.features[ok], res.features[ok]).max()) > 0.05  # the term does something


def test_lift_streams_maps_and_is_deterministic():
    gs, cams, maps = _scene(seed=3)
    calls = []

    def provider(i):
        calls.append(i)
        return maps[i]

    a = lift(gs, cams, provider, LiftConfig(iters=2, views_per_batch=2, cache_projections=False, compact_cache=False),
             progress=False)
    b = lift(gs, cams, maps, LiftConfig(iters=2, views_per_batch=2, record_contributions=False), progress=False)
    assert a.info["cache"] == "none" and b.info["cache"] == "full"
    assert torch.equal(a.features, b.features) and torch.equal(a.weight, b.weight)
    assert sorted(set(calls)) == list(range(len(cams)))
    # replayed from the recording (all chunks in one call per pass): the same sums up to their order, and the
    # same bits from run to run
    c, d = (lift(gs, cams, maps, LiftConfig(iters=2, views_per_batch=2), progress=False) for _ in range(2))
    assert c.info["recorded_chunks"] == (len(cams) + 1) // 2
    torch.testing.assert_close(c.weight, b.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(c.features, b.features, rtol=0, atol=1e-5)
    assert torch.equal(c.features, d.features) and torch.equal(c.weight, d.weight)


def test_lift_is_independent_of_the_scenes_order():
    """The lift runs on the scene in Z-order (morton_order) and answers in the scene's own order."""
    gs, cams, maps = _dense_scene(n=5000)  # some Gaussians hidden in every view: filled ones too
    perm = torch.randperm(len(gs), generator=torch.Generator().manual_seed(0))
    cfg = LiftConfig(views_per_batch=2, latent_dim=4, iters=3)  # passes whose active sets differ
    a, b = lift(gs, cams, maps, cfg, progress=False), lift(gs[perm], cams, maps, cfg, progress=False)
    assert int(a.filled.sum()) > 0 and a.info["passes"] > 2
    for name in ("valid", "filled"):
        assert torch.equal(getattr(b, name), getattr(a, name)[perm]), name
    for name in ("features", "weight", "visibility", "latents"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name)[perm], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.decoder, a.decoder, atol=1e-6, rtol=1e-5)
    assert a.info["observed"] == b.info["observed"] and a.info["hidden"] == b.info["hidden"]


def test_extrapolated_irls_ends_nearer_the_robust_mean():
    """Aitken's extrapolation every second pass (LiftConfig.extrapolate): where a Gaussian's samples disagree
    (random maps) the IRLS converges slowly, and 3 extrapolated passes end nearer the converged robust mean
    than 3 or 5 plain ones."""
    from rh3dgs.lifting.algorithm import aitken_factor

    torch.testing.assert_close(aitken_factor(torch.tensor([0.05, 0.2, 0.0, 0.09]), torch.tensor([0.1, 0.1, 0.0, 0.1])),
                               torch.tensor([2.0, 1.0, 1.0, 5.0]))  # r = 0.5; grew; none; 0.9 clipped to 0.8
    gs, cams, maps = random_lift_scene(1500, 6, 48, 8, 5, map_offset=0.3)
    kw = dict(views_per_batch=3, latent_dim=0, fill=False, tol=0.0)  # tol 0: every pass runs
    conv = lift(gs, cams, maps, LiftConfig(iters=300, extrapolate=False, **kw), progress=False)
    ok = conv.valid

    def err(**over):
        f = lift(gs, cams, maps, LiftConfig(**{**kw, **over}), progress=False).features
        return float(geodesic_distance(f[ok].double(), conv.features[ok].double()).mean())

    ext3, plain3, plain5 = err(iters=3), err(iters=3, extrapolate=False), err(iters=5, extrapolate=False)
    assert ext3 < 0.5 * plain3 and ext3 < plain5, (ext3, plain3, plain5)
    assert err(iters=300) < 1e-4  # extrapolating, the IRLS still converges to the same mean


def _dense_scene(n=20000, views=4, size=48, D=8, seed=2):
    """Small Gaussians, many per pixel: most pixels end (T -> 1e-4), most Gaussians are hidden in a view."""
    return random_lift_scene(n, views, size, D, seed, scale=0.04, opacity=(0.2, 0.75), map_offset=1.0)


@pytest.mark.parametrize("use_vcd", [True, False])
def test_compact_cache_is_exact(use_vcd):
    """Per view, the compact set (contributors + the Gaussians that end a pixel) gives the very same sums."""
    gs, cams, maps = _dense_scene()
    kw = dict(iters=3, use_vcd=use_vcd, latent_dim=4)
    full = lift(gs, cams, maps, LiftConfig(views_per_batch=1, cache_projections=True, record_contributions=False, **kw),
                progress=False)
    comp = lift(gs, cams, maps, LiftConfig(views_per_batch=1, cache_projections=False, **kw), progress=False)
    assert full.info["cache"] == "full" and comp.info["cache"] == "compact"  # compact by default when not full
    assert comp.info["compact_views"] == len(cams)
    # the full cache on CPU records the contributions its render composites and every pass replays them:
    # the very same sums for one chunk of views; for several, replayed in one call, each thread's sums are added
    # over the chunks before the threads' are added up (the same up to that order)
    for per in (len(cams), 1):
        rec = lift(gs, cams, maps, LiftConfig(views_per_batch=per, cache_projections=True, **kw), progress=False)
        trav = lift(gs, cams, maps, LiftConfig(views_per_batch=per, cache_projections=True, record_contributions=False,
                                               **kw), progress=False)
        assert rec.info["recorded_chunks"] == len(cams) // per and trav.info["recorded_chunks"] == 0
        if per > 1:
            assert torch.equal(rec.features, trav.features) and torch.equal(rec.weight, trav.weight)
        else:
            torch.testing.assert_close(rec.weight, trav.weight, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(rec.features, trav.features, rtol=0, atol=1e-5)
            assert torch.equal(rec.valid, trav.valid)
    assert comp.info["compact_gaussians_per_view"] < 0.6 * len(gs)  # many Gaussians dropped per view
    # one view per batch: the per-view sums are added in the same order, so bit-identical
    assert torch.equal(full.features, comp.features) and torch.equal(full.weight, comp.weight)
    assert torch.equal(full.valid, comp.valid) and torch.equal(full.latents, comp.latents)
    # several views per batch: the same up to the order of the sum over views
    comp3 = lift(gs, cams, maps, LiftConfig(views_per_batch=3, cache_projections=False, **kw), progress=False)
    full3 = lift(gs, cams, maps, LiftConfig(views_per_batch=3, **kw), progress=False)
    torch.testing.assert_close(comp3.weight, full3.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp3.features, full3.features, rtol=0, atol=1e-5)
    assert torch.equal(comp3.valid, full3.valid)


def test_recording_stops_at_the_first_chunk_that_does_not_fit(monkeypatch):
    """A budget for one chunk's contributions: the first chunk is recorded and replayed, the second one's
    recording is thrown away, the others are not recorded at all (each would be recorded and thrown away),
    and both run their traversal; the same lift."""
    import rh3dgs.lifting.views as lv
    from rh3dgs.rendering import render

    gs, cams, maps = _dense_scene()
    kw = dict(iters=2, latent_dim=0, views_per_batch=1, cache_projections=True)
    ref = lift(gs, cams, maps, LiftConfig(**kw), progress=False)
    recorded = []

    def counting(*a, **k):
        out = render(*a, **k)
        if k.get("record"):
            recorded.append(out.contributions.nbytes())
        return out

    monkeypatch.setattr(lv, "render", counting)
    lift(gs, cams, maps, LiftConfig(**kw), progress=False)
    monkeypatch.setattr(lv, "CACHE_BYTES", 2 * max(recorded) + 1)  # half the budget: one chunk fits, not two
    recorded.clear()
    one = lift(gs, cams, maps, LiftConfig(**kw), progress=False)
    assert one.info["recorded_chunks"] == 1 and len(recorded) == 2  # the second chunk did not fit: no more
    # the chunks not recorded are traversed instead of replayed, and the replayed chunks' sums are added per
    # thread before the threads' are: the same up to the order of the sums; the features with the tolerance of
    # test_compact_cache_is_exact (within 1e-6 on the AMD EPYCs of earlier runs, 2.7e-6 on an Intel Xeon)
    assert torch.allclose(one.weight, ref.weight)
    torch.testing.assert_close(one.features, ref.features, rtol=0, atol=1e-5)
    assert torch.equal(one.valid, ref.valid)


def test_guided_lift_is_the_lift_of_guided_maps():
    """LiftConfig(guided=True) on coarse maps = the plain lift of the maps upsampled by guided_upsample with
    each view's rendered colours; the compact cache keeps the guided maps (same sums as the full cache).
    VCD's mask-specificity term reads the regions of the maps *as the teacher gives them* (coarse here, guided in
    the reference), so it is off in this comparison; test_lift_of_mask_maps_matches_explicit_frechet_mean_with_mask_specificity checks it."""
    import dataclasses

    from rh3dgs.teachers.maps import guided_upsample, prepare_map
    from rh3dgs.method.vcd import VCDConfig

    gs, cams, maps = _dense_scene()
    coarse = [torch.nn.functional.avg_pool2d(m.permute(2, 0, 1)[None], 4)[0].permute(1, 2, 0) for m in maps]
    kw = dict(iters=2, latent_dim=0, views_per_batch=1, record_contributions=False,
              vcd=dataclasses.replace(VCDConfig.rh3dgs(), segment_power=0.0))
    guided = lift(gs, cams, coarse, LiftConfig(guided=True, cache_projections=True, **kw), progress=False)
    with torch.no_grad():
        ref_maps = [guided_upsample(prepare_map(c, tuple(c.shape[:2])), render(gs, cams[i]).rgb[0],
                                    LiftConfig().guide_sigma_color)
                    for i, c in enumerate(coarse)]
    ref = lift(gs, cams, ref_maps, LiftConfig(cache_projections=True, **kw), progress=False)  # full-res: no guide
    torch.testing.assert_close(guided.features, ref.features, rtol=0, atol=1e-5)
    assert torch.equal(guided.valid, ref.valid)
    comp = lift(gs, cams, coarse, LiftConfig(guided=True, cache_projections=False, **kw), progress=False)
    assert comp.info["cache"] == "compact" and torch.equal(comp.features, guided.features)
    plain = lift(gs, cams, coarse, LiftConfig(guided=False, cache_projections=True, **kw), progress=False)
    assert (plain.features - guided.features).norm(dim=-1).max() > 1e-2  # the guidance changes the answer


def test_compact_cache_needs_the_pixel_ending_gaussians(monkeypatch):
    """Keeping only the contributors would change the result: dropped Gaussians that end a pixel
    let the ones behind them composite there. Guards the second pass of the compaction."""
    import rh3dgs.lifting.views as lift_mod

    gs, cams, maps = _dense_scene(seed=4)
    cfg = LiftConfig(iters=2, views_per_batch=1, cache_projections=False, latent_dim=0)
    ref = lift(gs, cams, maps, LiftConfig(iters=2, views_per_batch=1, latent_dim=0, record_contributions=False),
               progress=False)  # the full cache's traversal: the compact sums bit for bit
    orig, calls = lift_mod.aggregate_sphere, []

    def contributors_only(*args, **kw):
        out = orig(*args, **kw)
        if args[3].shape[-1] == 1:  # the compaction's 1-channel passes; the 2nd finds the pixel-ending ones
            calls.append(1)
            if len(calls) % 2 == 0:
                out = (out[0], out[1], torch.zeros_like(out[2]))
        return out

    monkeypatch.setattr(lift_mod, "aggregate_sphere", contributors_only)
    bad = lift(gs, cams, maps, cfg, progress=False)
    assert calls and not torch.equal(bad.features, ref.features)
    monkeypatch.setattr(lift_mod, "aggregate_sphere", orig)
    assert torch.equal(lift(gs, cams, maps, cfg, progress=False).features, ref.features)


@pytest.mark.parametrize("budget", ["nothing", "half", "all but the last maps", "all"])
def test_compact_cache_budget(monkeypatch, budget):
    """Views whose compact data do not fit are recomputed each pass; maps that do not fit are requested again."""
    import rh3dgs.lifting.views as lift_mod

    gs, cams, maps = _dense_scene(seed=5)
    V = len(cams)
    cfg = LiftConfig(iters=2, views_per_batch=1, latent_dim=0, cache_projections=False)
    ref = lift(gs, cams, maps, cfg, progress=False)
    assert ref.info["compact_views"] == ref.info["compact_views_with_maps"] == V
    total, map_bytes = ref.info["cache_bytes"], maps[0].numel() * 4  # maps kept as given (smaller than upsampled)
    limit = {"nothing": 1, "half": total / 2, "all but the last maps": total - map_bytes / 2, "all": total}[budget]
    calls = []

    def provider(i):
        calls.append(i)
        return maps[i]

    monkeypatch.setattr(lift_mod, "CACHE_BYTES", limit)
    res = lift(gs, cams, provider, cfg, progress=False)
    info = res.info
    assert info["cache"] == "compact" and info["cache_bytes"] <= limit
    expected = {"nothing": (0, 0), "all but the last maps": (V, V - 1), "all": (V, V)}.get(budget)
    if expected:
        assert (info["compact_views"], info["compact_views_with_maps"]) == expected
    else:
        assert 0 < info["compact_views"] < V
    # + 1: view 0 read once for the teacher's dimension (LiftConfig.subspace applies when D > subspace)
    assert len(calls) == 1 + V + (info["passes"] - 1) * (V - info["compact_views_with_maps"])
    assert torch.equal(res.features, ref.features) and torch.equal(res.weight, ref.weight)


def test_compact_cache_with_maps_larger_than_the_image():
    """Teacher maps above the image resolution are cached resampled to the image size (the smaller)."""
    gs, cams, _ = _dense_scene(n=6000, views=3, seed=6)
    big = torch.nn.functional.normalize(torch.randn(3, 2 * cams.height, 2 * cams.width, 8,
                                                    generator=torch.Generator().manual_seed(0)) + 1.0, dim=-1)
    ref = lift(gs, cams, big, LiftConfig(iters=2, views_per_batch=1, latent_dim=0, record_contributions=False),
               progress=False)
    res = lift(gs, cams, big, LiftConfig(iters=2, views_per_batch=1, latent_dim=0, cache_projections=False),
               progress=False)
    assert res.info["compact_views_with_maps"] == 3
    assert torch.equal(res.features, ref.features) and torch.equal(res.weight, ref.weight)


def test_lift_batches_and_caches_by_size():
    gs, cams, maps = _scene()
    r = lift(gs, cams, maps, LiftConfig(method="euclidean", cache_projections=False), progress=False)
    assert r.info["cache"] == "none"  # no IRLS pass: nothing to cache for
    r = lift(gs, cams, maps, LiftConfig(iters=0, cache_projections=False), progress=False)
    assert r.info["cache"] == "none"
    r = lift(gs, cams, maps, LiftConfig(iters=1, cache_projections=False, compact_cache=False), progress=False)
    assert r.info["cache"] == "none"
    # views x Gaussians per batch bounded by max_batch_gaussians
    r = lift(gs, cams, maps, LiftConfig(iters=1, views_per_batch=8, max_batch_gaussians=2 * len(gs)), progress=False)
    assert r.info["views_per_batch"] == 2
    r = lift(gs, cams, maps, LiftConfig(iters=1, views_per_batch=3, max_batch_gaussians=1), progress=False)
    assert r.info["views_per_batch"] == 1
    with pytest.raises(ConfigError):
        LiftConfig(max_batch_gaussians=0)


def test_lift_rejects_bad_input():
    gs, cams, maps = _scene()
    bad = maps.clone()
    bad[1, 2, 3, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="view 1"):
        lift(gs, cams, bad, progress=False)
    with pytest.raises(ConfigError, match="method"):
        LiftConfig(method="mean")


def test_gaussians_seen_only_through_an_occluder_are_invalid():
    """Two wide layers of opacity 0.95 in front of a small Gaussian: it still composites (T ~ 0.0025 > 1e-4) but
    only through them, so visibility = mean T where it composites < min_visibility (1 %): invalid. (One layer
    cannot hide it: alpha is capped at 0.99, T >= 0.01.) Seen from the side as well, it is valid."""
    from rh3dgs import Cameras, Gaussians

    means = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, -0.5], [0.0, 0.0, 0.05]])  # hidden one is index 1
    scales = torch.tensor([[0.6, 0.6, 0.01], [0.05, 0.05, 0.05], [0.6, 0.6, 0.01]])
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 3)
    gs = Gaussians.from_activated(means, scales, quats, torch.tensor([0.95, 0.9, 0.95]), torch.rand(3, 3))
    top = Cameras.look_at(torch.tensor([[0.0, 0.01, 3.0]]), torch.zeros(3), width=32, height=32)
    maps = torch.nn.functional.normalize(torch.ones(1, 8, 8, 4), dim=-1)
    cfg = LiftConfig(iters=1, latent_dim=0, use_vcd=False, min_coverage=0.1, fill=False)
    r = lift(gs, top, maps, cfg, progress=False)
    assert r.weight[1] > cfg.min_weight and r.visibility[1] < 0.01 and not r.valid[1]
    assert r.visibility[2] > 0.9 and r.valid[0] and r.valid[2] and r.info["hidden"] == 1
    assert torch.equal(r.features[1], torch.zeros(4))
    # with a side view the hidden Gaussian is observed directly: its mean transmittance rises above 1 %
    side = Cameras.look_at(torch.tensor([[0.0, 0.01, 3.0], [3.0, 0.0, -0.5]]), torch.tensor([0.0, 0.0, -0.25]),
                           width=32, height=32)
    r2 = lift(gs, side, maps.expand(2, -1, -1, -1), cfg, progress=False)
    assert r2.visibility[1] > 0.01 and r2.valid[1]
    # min_visibility = 0 keeps it
    r0 = lift(gs, top, maps, LiftConfig(iters=1, latent_dim=0, use_vcd=False, min_coverage=0.1, min_visibility=0.0,
                                        fill=False), progress=False)
    assert r0.valid[1]
    # with filling (the default) the hidden Gaussian takes its observed neighbours' feature and is marked filled
    rf = lift(gs, top, maps, LiftConfig(iters=1, latent_dim=0, use_vcd=False, min_coverage=0.1, fill_radius=2.0),
              progress=False)
    assert rf.valid[1] and rf.filled[1] and not rf.filled[0] and rf.info["filled"] == 1
    torch.testing.assert_close(rf.features[1], maps[0, 0, 0])


def test_fill_gives_hidden_gaussians_the_feature_of_their_coloured_neighbours():
    """Hidden floor (grey) under a box (blue): grey hidden Gaussians take the floor's feature, blue ones the box's."""
    from rh3dgs.lifting.fill import fill_from_neighbours

    g = torch.Generator().manual_seed(0)
    floor_obs = torch.cat([torch.rand(200, 2, generator=g) * 2 - 1, torch.zeros(200, 1)], 1)
    floor_obs = floor_obs[floor_obs[:, :2].abs().amax(1) > 0.3]  # seen floor around the box
    box_obs = torch.cat([torch.rand(100, 2, generator=g) * 0.6 - 0.3, torch.full((100, 1), 0.3)], 1)  # box top
    hid_floor = torch.cat([torch.rand(30, 2, generator=g) * 0.5 - 0.25, torch.zeros(30, 1)], 1)
    hid_box = torch.cat([torch.rand(30, 2, generator=g) * 0.5 - 0.25, torch.full((30, 1), 0.02)], 1)  # box bottom
    means = torch.cat([floor_obs, box_obs, hid_floor, hid_box])
    grey, blue = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.1, 0.2, 0.9])
    n1, n2 = len(floor_obs), len(box_obs)
    colors = torch.cat([grey.expand(n1, 3), blue.expand(n2, 3), grey.expand(30, 3), blue.expand(30, 3)])
    feats = torch.zeros(len(means), 2)
    feats[:n1, 0] = 1.0
    feats[n1:n1 + n2, 1] = 1.0
    observed = torch.zeros(len(means), dtype=torch.bool)
    observed[:n1 + n2] = True
    out, filled = fill_from_neighbours(means, colors, feats, observed, k=16, radius=1.0)
    assert filled[n1 + n2:].all() and not filled[:n1 + n2].any()
    assert torch.equal(out[:n1 + n2], feats[:n1 + n2])
    assert (out[n1 + n2:n1 + n2 + 30].argmax(-1) == 0).all()  # hidden floor -> floor
    assert (out[n1 + n2 + 30:].argmax(-1) == 1).all()  # box bottom -> box
    torch.testing.assert_close(out[n1 + n2:].norm(dim=-1), torch.ones(60))
    # the nearest observed Gaussians are the other surface's (a wall touching the floor): colour still decides
    wall = torch.cat([torch.full((60, 1), 0.26), torch.rand(60, 1, generator=g) * 0.5 - 0.25,
                      torch.rand(60, 1, generator=g) * 0.3], 1)
    m3 = torch.cat([means[:n1 + n2], wall, torch.tensor([[0.25, 0.0, 0.0]])])
    c3 = torch.cat([colors[:n1 + n2], blue.expand(60, 3), grey[None]])
    f3 = torch.cat([feats[:n1 + n2], torch.tensor([[0.0, 1.0]]).expand(60, 2), torch.zeros(1, 2)])
    o3 = torch.ones(len(m3), dtype=torch.bool)
    o3[-1] = False
    out3, _ = fill_from_neighbours(m3, c3, f3, o3, radius=1.0)
    assert int(out3[-1].argmax()) == 0
    # a colour unlike any neighbour's (weights that would underflow): filled all the same, by distance
    c4 = c3.clone()
    c4[-1] = torch.tensor([1.0, 0.0, 0.0])
    out4, filled4 = fill_from_neighbours(m3, c4, f3, o3, radius=1.0, color_sigma=0.01)
    assert filled4[-1] and torch.isfinite(out4[-1]).all() and abs(float(out4[-1].norm()) - 1.0) < 1e-5
    # nothing observed within the radius: stays without a feature
    out2, filled2 = fill_from_neighbours(means, colors, feats, observed, radius=1e-4)
    assert not filled2.any() and torch.equal(out2, feats)


def test_subspace_lift_equals_the_full_lift_when_the_maps_live_in_it():
    """Maps whose rows span k <= subspace < D dimensions: the principal-subspace lift is the full-D lift
    (the same means, mapped back to D), and it is what runs when D > subspace."""
    gs, cams, maps8 = _scene(n=400, views=4, size=32, D=8, seed=3)
    Q = torch.linalg.qr(torch.randn(40, 8, generator=torch.Generator().manual_seed(1)))[0]  # [40, 8] orthonormal
    maps = maps8 @ Q.T  # [B, h, w, 40], unit rows in span(Q)
    kw = dict(iters=3, latent_dim=4, views_per_batch=2)
    full = lift(gs, cams, maps, LiftConfig(subspace=0, **kw), progress=False)
    sub = lift(gs, cams, maps, LiftConfig(subspace=16, **kw), progress=False)
    assert full.info["subspace"] is None and sub.info["subspace"] == 16
    assert sub.features.shape == full.features.shape == (len(gs), 40)
    assert torch.equal(sub.valid, full.valid)
    ok = full.valid
    assert torch.allclose(sub.features[ok].norm(dim=-1), torch.ones(int(ok.sum())), atol=1e-5)
    assert float(geodesic_distance(sub.features[ok], full.features[ok]).max()) < 2e-3
    # and the lift of the 8-d maps themselves, mapped through Q: the same answer again
    small = lift(gs, cams, maps8, LiftConfig(subspace=0, **kw), progress=False)
    assert float(geodesic_distance(sub.features[ok], small.features[ok] @ Q.T).max()) < 2e-3
    # the decoder, taken on the subspace's k x k moments, is the full-D PCA's (same signs, same latents)
    assert sub.decoder.shape == full.decoder.shape == (40, 4)
    assert torch.allclose(sub.decoder, full.decoder, atol=2e-3) and torch.allclose(sub.latents, full.latents, atol=2e-3)


def test_pca_decoder_in_a_subspace_equals_the_full_pca():
    """pca_decoder(coords, w, d, basis) = pca_decoder(coords @ basis.T, w, d): decoder [D, d] and latents."""
    from rh3dgs.lifting import pca_decoder

    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(48, 12, generator=g))[0]  # [D=48, k=12]
    coords = torch.randn(300, 12, generator=g) * torch.linspace(3.0, 0.1, 12)  # distinct variances
    w = torch.rand(300, generator=g)
    dec_full, lat_full = pca_decoder(coords @ basis.T, w, 5)
    dec_sub, lat_sub = pca_decoder(coords, w, 5, basis)
    assert dec_sub.shape == (48, 5) and lat_sub.shape == (300, 5)
    assert torch.allclose(dec_sub, dec_full, atol=1e-5) and torch.allclose(lat_sub, lat_full, atol=1e-4)


def test_subspace_lift_keeps_the_dominant_directions_of_noisy_maps():
    """D = 96 maps: 4 class directions plus isotropic noise. In the span of the classes the 8-d subspace lift
    gives the Gaussians the full-D answer (converged means: median cosine > 0.999, 99 % of them > 0.98; the
    few whose samples split between classes, where the Huber objective is flat, > 0.95), with less of the
    noise outside it."""
    gs, cams, _ = _scene(n=400, views=4, size=32, D=8, seed=4)
    g = torch.Generator().manual_seed(2)
    protos = torch.linalg.qr(torch.randn(96, 4, generator=g))[0].T  # 4 orthonormal class directions
    cls = torch.randint(0, 4, (4, 8, 8), generator=g)
    maps = torch.nn.functional.normalize(protos[cls] + 0.05 * torch.randn(4, 8, 8, 96, generator=g), dim=-1)
    kw = dict(iters=40, tol=1e-6, latent_dim=0, views_per_batch=2)
    full = lift(gs, cams, maps, LiftConfig(subspace=0, **kw), progress=False)
    sub = lift(gs, cams, maps, LiftConfig(subspace=8, **kw), progress=False)
    ok = full.valid
    a, b = sub.features[ok] @ protos.T, full.features[ok] @ protos.T  # class coordinates
    cos = (torch.nn.functional.normalize(a, dim=-1) * torch.nn.functional.normalize(b, dim=-1)).sum(-1)
    assert float(cos.median()) > 0.999 and float(torch.quantile(cos, 0.01)) > 0.98 and float(cos.min()) > 0.95
    assert float(a.norm(dim=-1).median()) > float(b.norm(dim=-1).median()) + 0.02  # the noise removed
