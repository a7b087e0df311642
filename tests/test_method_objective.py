"""rh3dgs.method.objective: the teacher-resolution comparison (an exact forward model scores 0), the switches, LIC."""
import math

import pytest
import torch
import torch.nn.functional as F

from rh3dgs.errors import ConfigError
from rh3dgs.method.objective import ObjectiveConfig, SemanticObjective, teacher_grid


def _render_like(B=2, H=16, W=16, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lat = torch.randn(B, H, W, d, generator=g)
    alpha = torch.ones(B, H, W)
    depth = torch.full((B, H, W), 2.0)
    return lat, alpha, depth, depth * depth


def test_teacher_grid():
    assert teacher_grid(torch.zeros(3, 4, 4, 8), (16, 16)) == (4, 4)  # patch tokens: compare at the grid
    assert teacher_grid(torch.zeros(16, 16, 8), (16, 16)) == (16, 16)
    assert teacher_grid(torch.zeros(32, 32, 8), (16, 16)) == (16, 16)  # finer than the render: at the render


def test_exact_forward_model_scores_zero_at_teacher_resolution():
    """A teacher that IS the 4x4-pooled, decoded render: the teacher-resolution loss is 0, the image one is not."""
    lat, alpha, d1, d2 = _render_like()
    dec = torch.linalg.qr(torch.randn(8, 4))[0]
    pooled = F.avg_pool2d(lat.permute(0, 3, 1, 2), 4).permute(0, 2, 3, 1)
    teacher = F.normalize(pooled @ dec.T, dim=-1)  # [2, 4, 4, 8]
    for use_vfm in (False, True):
        cfg = ObjectiveConfig(use_vcd=False, use_vfm=use_vfm, use_lic=False, background_latent=False, lambda_ray=0.0)
        obj = SemanticObjective(cfg, latent_dim=4, steps=10)
        loss, parts = obj(0, lat, alpha, d1, d2, dec, teacher)
        assert abs(float(loss)) < 1e-5, (use_vfm, float(loss))
        img = SemanticObjective(ObjectiveConfig(use_vcd=False, use_vfm=use_vfm, use_lic=False, resolution="image",
                                                background_latent=False, lambda_ray=0.0), 4, 10)
        assert float(img(0, lat, alpha, d1, d2, dec, teacher)[0]) > 0.05


def test_cosine_value_and_background_latent():
    lat, alpha, d1, d2 = _render_like(B=1, H=2, W=2, d=2)
    alpha = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    lat = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]]])
    dec = torch.eye(2)
    teacher = torch.tensor([[[[0.0, 1.0]]]])  # one 1x1 grid cell: pooled = mean of the 4 pixels
    cfg = ObjectiveConfig(use_vcd=False, use_vfm=False, use_lic=False)
    obj = SemanticObjective(cfg, 2, 10)
    # background latent 0: pooled = (0.5, 0) -> cos 0 -> loss 1
    assert float(obj(0, lat, alpha, d1, d2, dec, teacher)[0]) == pytest.approx(1.0)
    with torch.no_grad():
        obj.background.copy_(torch.tensor([0.0, 3.0]))
    # pooled = (0.5, 1.5) -> cos = 1.5 / sqrt(2.5)
    assert float(obj(0, lat, alpha, d1, d2, dec, teacher)[0]) == pytest.approx(1 - 1.5 / math.sqrt(2.5), rel=1e-5)


def test_spherical_latents_and_gradients_reach_latents():
    obj = SemanticObjective(ObjectiveConfig(), 4, 10)
    raw = torch.randn(5, 4) * 3
    torch.testing.assert_close(obj.gaussian_latents(raw).norm(dim=-1), torch.ones(5))
    assert torch.equal(obj.gaussian_latents(torch.zeros(2, 4)), torch.zeros(2, 4))
    lat, alpha, d1, d2 = _render_like()
    lat.requires_grad_(True)
    teacher = F.normalize(torch.randn(2, 4, 4, 8), dim=-1)
    loss, parts = obj(3, lat, alpha, d1, d2, torch.linalg.qr(torch.randn(8, 4))[0], teacher)
    loss.backward()
    assert lat.grad.abs().sum() > 0 and {"pix", "mean", "delta"} <= set(parts)


def test_contrast_on_after_start_and_zero_before():
    steps = 10
    obj = SemanticObjective(ObjectiveConfig(use_lic=True, lic_start=0.5), 4, steps)
    g = torch.Generator().manual_seed(0)
    means = torch.rand(300, 3, generator=g) * 0.2
    colors = torch.rand(300, 1, generator=g).expand(-1, 3) * 0.3  # grey levels: LIC's appearance positives
    lat = torch.randn(300, 4, generator=g, requires_grad=True)
    dec = torch.linalg.qr(torch.randn(8, 4, generator=g))[0]
    assert float(obj.lic_loss(2, lat, dec, means, colors=colors)) == 0.0
    c = obj.lic_loss(6, lat, dec, means, colors=colors)
    assert float(c) > 0
    c.backward()
    assert lat.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="colours"):  # appearance positives need the Gaussians' colours
        SemanticObjective(ObjectiveConfig(), 4, steps).lic_loss(0, lat, dec, means)
    off = SemanticObjective(ObjectiveConfig(use_lic=False), 4, steps)
    assert float(off.lic_loss(6, lat, dec, means)) == 0.0



@pytest.mark.parametrize("form", ["pull", "infonce"])
def test_contrast_in_decoder_coordinates_equals_lic_on_the_decoded_features(form):
    """``contrast`` runs LIC on ``f @ R.T`` (the decoder's QR factor) at any row scale; the same value and
    latent gradients as LIC on the unit decoded features ``normalize(f @ decoder.T)`` in D dimensions."""
    from rh3dgs.method.lic import LICConfig, LICLoss

    g = torch.Generator().manual_seed(3)
    N, d, D = 400, 4, 16
    means = torch.rand(N, 3, generator=g) * 0.2
    colors = torch.rand(N, 1, generator=g).expand(-1, 3) * 0.3
    dec = torch.randn(D, d, generator=g)  # not orthonormal: R carries the decoder's metric
    raw = (torch.randn(N, d, generator=g) * torch.rand(N, 1, generator=g) * 5).requires_grad_(True)
    lic_cfg = LICConfig.rh3dgs(warmup_steps=0, form=form, num_random_negatives=0 if form == "pull" else 16)
    obj = SemanticObjective(ObjectiveConfig(lic=lic_cfg), d, 10)
    ours = obj.lic_loss(5, raw, dec, means, colors=colors)
    ours.backward()
    ref_raw = raw.detach().clone().requires_grad_(True)
    ref = obj.cfg.lambda_con * LICLoss(lic_cfg)(F.normalize(ref_raw @ dec.T, dim=-1), 5, means=means, colors=colors)
    ref.backward()
    assert float(ours) > 0
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(raw.grad, ref_raw.grad, rtol=1e-4, atol=1e-6)


def test_config_errors():
    with pytest.raises(ConfigError):
        ObjectiveConfig(resolution="nope")
    with pytest.raises(ConfigError):
        ObjectiveConfig(lic_start=2.0)
    assert ObjectiveConfig().label == "VCD + VFM + ray + LIC"
    assert ObjectiveConfig(use_lic=False).label == "VCD + VFM + ray"
    assert ObjectiveConfig(use_vcd=False, use_vfm=False, use_lic=False, lambda_ray=0.0).label == "cosine"


def test_mask_teacher_pixels_weighted_by_mask_specificity():
    """A mask teacher at the render's resolution: pixels of a 64-pixel mask weigh (192 / 64) ** gamma as much as
    those of a 192-pixel mask (VCD's mask-specificity term, read off the teacher map as given)."""
    lat, alpha, d1, d2 = _render_like(B=1)
    teacher = torch.zeros(1, 16, 16, 8)
    teacher[0, :, :12, 0] = 1.0  # 192 px
    teacher[0, :, 12:, 1] = 1.0  # 64 px
    cfg = ObjectiveConfig(use_lic=False)
    gamma = cfg.vcd.segment_power
    assert gamma > 0
    obj = SemanticObjective(cfg, 4, 10)
    _, z, w = obj.compare(lat, alpha, d1, d2, torch.linalg.qr(torch.randn(8, 4))[0], teacher)
    assert float(w[0, 3, 14] / w[0, 3, 2]) == pytest.approx(3.0 ** gamma, rel=1e-5)
    off = SemanticObjective(ObjectiveConfig(use_lic=False, use_vcd=False), 4, 10)
    assert torch.allclose(off.compare(lat, alpha, d1, d2, torch.eye(8, 4), teacher)[2], torch.ones(1, 16, 16))


def test_ray_spread_is_the_weighted_spread_of_the_composited_gaussians():
    """ray_spread from the render of unit latents and A = the explicit sum_i w_i |f_i - F / A|^2 over each pixel's
    compositing weights (enumerated from the fixed views' sparse weight matrices)."""
    from _scenes import random_lift_scene
    from rh3dgs.method.objective import ray_spread
    from rh3dgs.rendering import fixed_views

    gs, cams, _ = random_lift_scene(n=200, views=2, size=24)
    views = fixed_views(gs, cams)
    f = F.normalize(torch.randn(len(gs), 4, generator=torch.Generator().manual_seed(1)), dim=-1)
    lat = views.render(f, [0, 1])
    got = ray_spread(lat, views.alpha, min_coverage=0.0)
    ref = []
    for v in range(2):
        Wm = views.matrices[v][0].tocoo()  # [H*W, N] compositing weights w_i(u)
        w = torch.from_numpy(Wm.data).double()
        pix, gid = torch.from_numpy(Wm.row).long(), torch.from_numpy(Wm.col).long()
        A = torch.zeros(24 * 24, dtype=torch.float64).index_add_(0, pix, w)
        Fm = torch.zeros(24 * 24, 4, dtype=torch.float64).index_add_(0, pix, w[:, None] * f[gid].double())
        mean = Fm / A.clamp_min(1e-6)[:, None]
        ref.append(torch.zeros(24 * 24, dtype=torch.float64).index_add_(0, pix, w * ((f[gid].double() - mean[pix]) ** 2).sum(-1)))
    ref = torch.stack(ref)
    assert float(ref.max()) > 0.1  # Gaussians overlap: there is spread to measure
    assert float(got) == pytest.approx(float(ref.mean()), rel=1e-4)
    same = views.render(F.normalize(torch.ones(len(gs), 4), dim=-1), [0, 1])  # one feature everywhere: no spread
    assert abs(float(ray_spread(same, views.alpha, min_coverage=0.0))) < 1e-5


@pytest.mark.parametrize("use_vfm,lambda_mean", [(True, 0.0), (True, 0.1), (False, 0.0)])
def test_a_batch_split_with_its_totals_adds_up_to_the_whole_batch(use_vfm, lambda_mean):
    """SemanticObjective.totals: the views of a batch scored apart, each divided by the whole batch's normalisers
    (the distributed distillation's ranks), give the batch's loss and gradients."""
    from rh3dgs.method.vfm import VFMConfig

    g = torch.Generator().manual_seed(1)
    lat, _, d1, d2 = _render_like(B=3, d=4, seed=2)
    alpha = 0.3 + 0.7 * torch.rand(3, 16, 16, generator=g)  # some pixels below the ray term's coverage
    teacher = F.normalize(torch.randn(3, 4, 4, 8, generator=g) + 1.0, dim=-1)
    teacher[1, :2] = 0.0  # pixels without a feature
    dec = torch.linalg.qr(torch.randn(8, 4, generator=g))[0]
    vfm = VFMConfig(schedule="constant", delta_start=0.1, delta_end=0.1, lambda_mean=lambda_mean, min_region_pixels=1)
    obj = SemanticObjective(ObjectiveConfig(use_vfm=use_vfm, vfm=vfm, use_lic=False), latent_dim=4, steps=10)
    whole_lat = lat.clone().requires_grad_(True)
    whole, _ = obj(0, whole_lat, alpha, d1, d2, dec, teacher)
    whole.backward()
    totals = sum(obj.totals(alpha[v:v + 1], d1[v:v + 1], d2[v:v + 1], teacher[v:v + 1]) for v in range(3))
    parts_lat = lat.clone().requires_grad_(True)
    shares = [obj(0, parts_lat[s], alpha[s], d1[s], d2[s], dec, teacher[s], totals=totals)[0]
              for s in (slice(0, 2), slice(2, 3))]
    sum(shares).backward()
    torch.testing.assert_close(sum(shares), whole, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(parts_lat.grad, whole_lat.grad, rtol=1e-4, atol=1e-9)
    alone = obj(0, lat[2:3], alpha[2:3], d1[2:3], d2[2:3], dec, teacher[2:3])[0]
    assert abs(float(alone) - float(shares[1])) > 1e-4  # a view's own normalisers would not add up
