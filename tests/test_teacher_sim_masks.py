"""rh3dgs.data.teacher_sim_masks: one embedding per mask, and each corruption does what it says."""
import numpy as np
import pytest
import torch

from rh3dgs.data.teacher_sim import make_prototypes
from rh3dgs.data.teacher_sim_masks import MaskTeacherSimConfig, simulate_mask_feature_maps
from rh3dgs.errors import ConfigError


def _views(B=6, H=32, W=32):
    """Instance 0 (class 0) fills the left half, instance 1 (class 1) a square on the right, background elsewhere."""
    inst = torch.full((B, H, W), 255, dtype=torch.long)
    inst[:, :, : W // 2] = 0
    inst[:, 8:24, 20:28] = 1
    return inst, inst.clone()


def _clean(**kw):
    base = dict(merge_rate=0.0, split_rate=0.0, miss_rate=0.0, failure_rate=0.0, context=0.0, noise_deg=0.0,
                edge_jitter_px=0.0, dim=16)
    base.update(kw)
    return MaskTeacherSimConfig(**base)


def test_clean_masks_are_the_prototypes_with_sharp_edges():
    inst, cls = _views()
    cfg = _clean()
    f = simulate_mask_feature_maps(inst, cls, cfg, num_classes=2)
    P = make_prototypes(2, cfg.prototype_config())
    assert f.shape == (6, 32, 32, 16)
    torch.testing.assert_close(f[0, 5, 3].double(), torch.from_numpy(P.classes[0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(f[0, 10, 21].double(), torch.from_numpy(P.classes[1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(f[0, 2, 30].double(), torch.from_numpy(P.background), atol=1e-6, rtol=0)
    assert torch.equal(f, simulate_mask_feature_maps(inst, cls, cfg, num_classes=2))  # deterministic


def test_miss_gives_zero_rows_and_failure_a_confuser():
    inst, cls = _views(B=40)
    f = simulate_mask_feature_maps(inst, cls, _clean(miss_rate=1.0), num_classes=2)
    assert float(f.abs().max()) == 0.0
    cfg = _clean(failure_rate=0.3, seed=3)
    f = simulate_mask_feature_maps(inst, cls, cfg, num_classes=2)
    P = make_prototypes(2, cfg.prototype_config())
    sq = f[:, 10, 21].double() @ torch.from_numpy(P.classes).T  # the square's embedding per view
    wrong = (sq.argmax(-1) == 0).float().mean()
    assert 0.1 < float(wrong) < 0.5  # ~30 % of the views name the square "class 0"


def test_merge_mixes_adjacent_masks_by_area():
    inst, cls = _views(B=30)
    inst[:, 8:24, 16:20] = 1  # make the square touch the left half
    cls = inst.clone()
    cfg = _clean(merge_rate=1.0)
    f = simulate_mask_feature_maps(inst, cls, cfg, num_classes=2)
    P = make_prototypes(2, cfg.prototype_config())
    # every mask merged with a neighbour: the left half and the square share one embedding in some view
    same = (f[:, 5, 3] - f[:, 10, 21]).abs().amax(-1) < 1e-6
    assert same.any()
    v = int(torch.nonzero(same)[0])
    c0, c1 = float(f[v, 5, 3].double() @ torch.from_numpy(P.classes[0])), float(f[v, 5, 3].double() @ torch.from_numpy(P.classes[1]))
    assert c0 > c1  # area-weighted: the left half (512 px) outweighs the square (192 px)


def test_split_and_jitter_and_config():
    inst, cls = _views(B=20)
    f = simulate_mask_feature_maps(inst, cls, _clean(split_rate=1.0, noise_deg=10.0), num_classes=2)
    top, bottom = f[:, 9, 24], f[:, 23, 24]
    assert ((top - bottom).abs().amax(-1) > 1e-4).any()  # split halves get their own draws
    j = simulate_mask_feature_maps(inst, cls, _clean(edge_jitter_px=2.0), num_classes=2)
    c = simulate_mask_feature_maps(inst, cls, _clean(), num_classes=2)
    diff = (j - c).abs().amax(-1) > 1e-6
    assert 0 < float(diff.float().mean()) < 0.2  # only pixels near the boundaries move
    with pytest.raises(ConfigError):
        MaskTeacherSimConfig(merge_rate=1.5)
    assert np.isclose(float(c.norm(dim=-1).min()), 1.0, atol=1e-5)


def test_azimuth_failures_and_levels():
    """failure_mode='azimuth' misrecognises a class's masks in the views of its arc only; level_probs gives each view
    one granularity: parts (more, smaller regions, pulled towards the cone centre) or groups (merged regions)."""
    import math

    from rh3dgs.data.teacher_sim import azimuth_arcs, in_arc

    B = 90
    inst, cls = _views(B=B)
    az = [2 * math.pi * v / B for v in range(B)]
    cfg = _clean(failure_rate=0.3, failure_mode="azimuth")
    f = simulate_mask_feature_maps(inst, cls, cfg, num_classes=2, view_azimuths=az)
    P = torch.from_numpy(make_prototypes(2, cfg.prototype_config()).classes).float()
    centres, _, half = azimuth_arcs(cfg.seed, 109, 2, 0.3)
    for v in range(B):
        arg = int((f[v, 5, 3] @ P.T).argmax())  # a pixel of class 0
        assert (arg != 0) == in_arc(az[v], centres[0], half)
    with pytest.raises(ConfigError, match="view_azimuths"):
        simulate_mask_feature_maps(inst, cls, cfg, num_classes=2)

    def regions(x):
        return len(torch.unique(x.reshape(-1, x.shape[-1]), dim=0))

    parts = simulate_mask_feature_maps(inst, cls, _clean(noise_deg=5.0, level_probs=(1.0, 0.0, 0.0)), num_classes=2)
    objects = simulate_mask_feature_maps(inst, cls, _clean(noise_deg=5.0, level_probs=(0.0, 1.0, 0.0)), num_classes=2)
    groups = simulate_mask_feature_maps(inst, cls, _clean(noise_deg=5.0, level_probs=(0.0, 0.0, 1.0)), num_classes=2)
    assert torch.equal(objects, simulate_mask_feature_maps(inst, cls, _clean(noise_deg=5.0), num_classes=2))
    assert all(regions(parts[v]) > regions(objects[v]) == 3 for v in range(4))
    assert all(regions(groups[v]) < 3 for v in range(4))
    parts = simulate_mask_feature_maps(inst, cls, _clean(level_probs=(1.0, 0.0, 0.0)), num_classes=2)
    objects = simulate_mask_feature_maps(inst, cls, _clean(level_probs=(0.0, 1.0, 0.0)), num_classes=2)
    centre = torch.from_numpy(make_prototypes(2, _clean().prototype_config()).center).float()
    assert float(parts[0, 5, 3] @ centre) > float(objects[0, 5, 3] @ centre) + 0.02
    with pytest.raises(ConfigError, match="level_probs"):
        _clean(level_probs=(0.5, 0.4, 0.3))
