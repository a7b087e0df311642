"""Distillation on fixed geometry: loss decreases, clean teacher -> per-Gaussian classes, determinism, variants,
and the objective at the teacher's resolution refines the lift it starts from."""
import math

import pytest
import torch
from _scenes import rendered_labels

from rh3dgs.data.synthetic import SceneConfig, make_scene
from rh3dgs.data.teacher_sim import TeacherSimConfig, make_prototypes, simulate_feature_maps
from rh3dgs.distill import DistillConfig, distill
from rh3dgs.errors import ConfigError
from rh3dgs.method.objective import VFM_DELTA, ObjectiveConfig
from rh3dgs.rendering import render


@pytest.fixture(scope="module")
def tiny():
    scene = make_scene(SceneConfig(gaussians_per_unit_area=300, image_size=32, num_views=6))
    K = len(scene.class_names)
    lab, depth = rendered_labels(scene)
    tcfg = TeacherSimConfig.clean(dim=16, patch_size=4)
    maps = simulate_feature_maps(lab, depth, tcfg, num_classes=K)
    protos = torch.from_numpy(make_prototypes(K, tcfg).classes).float()
    return scene, maps, protos


def _accuracy(scene, res, protos):
    pred = (res.features @ protos.T).argmax(-1)
    v = res.valid
    return float(((pred == scene.class_ids) & v).sum()) / max(1, int(v.sum()))


def test_loss_decreases_and_clean_teacher_classes(tiny):
    scene, maps, protos = tiny
    cfg = DistillConfig(steps=60, lr=0.05, latent_dim=8, init="pca", objective=ObjectiveConfig(use_lic=False))
    res = distill(scene.gaussians, scene.cameras, maps, cfg)
    losses = [h["loss"] for h in res.history]
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.3 * sum(losses[:5]) / 5
    K = protos.shape[0]
    acc = _accuracy(scene, res, protos)
    assert acc > 1.0 / K + 0.25, acc
    assert res.latents.shape == (len(scene.gaussians), 8) and res.decoder.shape == (16, 8)
    assert res.valid.float().mean() > 0.5
    torch.testing.assert_close(res.features[res.valid].norm(dim=-1), torch.ones(int(res.valid.sum())))


def test_deterministic_with_seed(tiny):
    scene, maps, _ = tiny
    cfg = DistillConfig(steps=8, latent_dim=4, seed=3, init="pca")
    a = distill(scene.gaussians, scene.cameras, maps, cfg)
    b = distill(scene.gaussians, scene.cameras, maps, cfg)
    assert torch.equal(a.latents, b.latents) and torch.equal(a.decoder, b.decoder)
    c = distill(scene.gaussians, scene.cameras, maps, DistillConfig(steps=8, latent_dim=4, seed=4, init="pca"))
    assert not torch.equal(a.latents, c.latents)


def test_variants_run_and_lic_switches_on(tiny):
    scene, maps, protos = tiny
    cfg = DistillConfig(steps=20, lr=0.05, latent_dim=8, objective=ObjectiveConfig(lic_start=0.4))
    res = distill(scene.gaussians, scene.cameras, maps, cfg)
    assert cfg.label == "distill (VCD + VFM + ray + LIC)"
    warm = cfg.objective.lic_config(cfg.steps).warmup_steps
    assert 0 < warm < 20
    assert all(h["lic"] == 0.0 for h in res.history[:warm])
    assert any(h["lic"] > 0 for h in res.history[warm:])
    deltas = [h["delta"] for h in res.history]
    assert all(d == pytest.approx(VFM_DELTA) for d in deltas)  # from the lift: a constant threshold
    assert all(h["ray"] >= 0 for h in res.history)
    assert all(math.isfinite(h["loss"]) for h in res.history)


def test_init_from_lift(tiny):
    scene, maps, protos = tiny
    res0 = distill(scene.gaussians, scene.cameras, maps, DistillConfig(steps=0, latent_dim=8, init="lift"))
    # the lift alone already classifies the Gaussians of a clean teacher
    assert _accuracy(scene, res0, protos) > 1.0 / protos.shape[0] + 0.25
    assert res0.lift is not None and torch.equal(res0.valid, res0.lift.valid)


def test_teacher_resolution_objective_sharpens_the_lift():
    """A patch-pooled teacher (8 px patches, area mixing, no other corruption): the lift averages the blur into
    the Gaussians near object boundaries; training at the teacher's resolution recovers them (held-out views)."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene
    from rh3dgs.field import SemanticField

    scene = make_scene(SceneConfig(gaussians_per_unit_area=900, image_size=64, num_views=12, heldout_views=4,
                                   orbit_radius=2.5))
    K = len(scene.class_names)
    lab, depth = rendered_labels(scene)
    tcfg = TeacherSimConfig.clean(dim=16, patch_size=8, bleed=1.0)
    grid = simulate_feature_maps(lab, depth, tcfg, num_classes=K)  # [12, 8, 8, 16]: the teacher's own grid
    protos = torch.from_numpy(make_prototypes(K, tcfg).classes).float()
    test_lab, _ = rendered_labels(scene, scene.heldout_cameras)

    def held_out_accuracy(lat, dec):
        with torch.no_grad():
            r = render(scene.gaussians, scene.heldout_cameras, lat, rgb=False)
        pred = SemanticField(lat, dec).cosine(r.features, protos).argmax(-1)
        fg = test_lab != 255
        return float((pred == test_lab)[fg].float().mean())

    res = distill(scene.gaussians, scene.cameras, grid, DistillConfig(steps=80, latent_dim=8,
                                                                      objective=ObjectiveConfig(use_lic=False)))
    a_lift = held_out_accuracy(res.lift.latents, res.lift.decoder)
    a_trained = held_out_accuracy(res.latents, res.decoder)
    assert a_trained > a_lift + 0.01, (a_lift, a_trained)


def test_config_errors():
    with pytest.raises(ConfigError):
        DistillConfig(init="nope")
    with pytest.raises(ConfigError):
        DistillConfig(steps=-1)
    with pytest.raises(ConfigError):
        DistillConfig(lr=0)


def test_checkpoint_resume_is_exact(tiny, tmp_path, monkeypatch):
    """distill(checkpoint=...) killed mid-run (here: an error at step 7) and run again resumes from the step-4
    checkpoint and ends where the uninterrupted run ends, bit for bit (optimiser, generators, LIC's graph)."""
    from rh3dgs.method.objective import SemanticObjective

    scene, maps, _ = tiny
    cfg = DistillConfig(steps=10, latent_dim=4, checkpoint_every=4, views_per_step=2)
    full = distill(scene.gaussians, scene.cameras, maps, cfg)
    forward = SemanticObjective.forward

    def fail_at_7(self, step, *args, **kwargs):
        if step == 7:
            raise KeyboardInterrupt
        return forward(self, step, *args, **kwargs)

    monkeypatch.setattr(SemanticObjective, "forward", fail_at_7)
    with pytest.raises(KeyboardInterrupt):
        distill(scene.gaussians, scene.cameras, maps, cfg, checkpoint=tmp_path)
    monkeypatch.setattr(SemanticObjective, "forward", forward)
    assert [p.name for p in (tmp_path / "distill").glob("step-*.pt")] == ["step-000004.pt"]
    again = distill(scene.gaussians, scene.cameras, maps, cfg, checkpoint=tmp_path)
    assert again.info["resumed_at_step"] == 4
    assert torch.equal(again.latents, full.latents) and torch.equal(again.decoder, full.decoder)
    assert again.history == full.history
    # another run's settings do not resume from it: the folder is cleared
    other = distill(scene.gaussians, scene.cameras, maps, DistillConfig(steps=2, latent_dim=4, checkpoint_every=4),
                    checkpoint=tmp_path)
    assert "resumed_at_step" not in other.info
