"""rh3dgs.method.selection: check views, the credit of the check loss to the Gaussians, and a returned field whose
check loss is never above the start's."""
import pytest
import torch
from _scenes import rendered_labels

from rh3dgs.data.synthetic import SceneConfig, make_scene
from rh3dgs.data.teacher_sim import TeacherSimConfig, simulate_feature_maps
from rh3dgs.distill import DistillConfig, distill
from rh3dgs.errors import ConfigError
from rh3dgs.method.objective import ObjectiveConfig, SemanticObjective
from rh3dgs.method.selection import (SelectionConfig, _credit, check_loss, check_view_indices, select_field)
from rh3dgs.rendering import fixed_views


@pytest.fixture(scope="module")
def scene_maps():
    scene = make_scene(SceneConfig(gaussians_per_unit_area=300, image_size=32, num_views=8))
    K = len(scene.class_names)
    lab, depth = rendered_labels(scene)
    maps = simulate_feature_maps(lab, depth, TeacherSimConfig(dim=16, patch_size=4, seed=3), num_classes=K)
    return scene, maps, fixed_views(scene.gaussians, scene.cameras)


def test_check_view_indices():
    assert check_view_indices(12, 0.25) == [2, 6, 10]
    assert check_view_indices(2, 0.9) == [1] and check_view_indices(3, 0.99) == [0, 2]  # never every view
    for n in range(2, 60):
        ids = check_view_indices(n, 1 / 6)
        assert len(ids) == len(set(ids)) == max(1, round(n / 6)) and all(0 <= i < n for i in ids)
    with pytest.raises(ConfigError):
        SelectionConfig(check_fraction=1.0)


def test_credit_is_the_compositing_weight_per_cell(scene_maps):
    """_credit(M) = sum_c a_i(c) M(c), a_i(c) the Gaussian's weight averaged over cell c: against the dense sum over
    the views' recorded compositing weights."""
    scene, maps, views = scene_maps
    obj = SemanticObjective(ObjectiveConfig(use_lic=False), 4, 10)
    grid = (8, 8)
    M = torch.randn(2, *grid)
    got = _credit(obj, views, [1, 5], grid, M)
    want = torch.zeros(len(scene.gaussians))
    for j, v in enumerate([1, 5]):
        w = torch.from_numpy(views.matrices[v][0].toarray()).float().reshape(32, 32, -1)  # [H, W, N]
        a = SemanticObjective.pool(w.permute(2, 0, 1)[..., None], grid)[..., 0]  # [N, h, w]
        want += (a * M[j]).sum((1, 2))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_selected_field_is_never_worse_than_the_start_on_the_check_views(scene_maps):
    """select_field returns the start, the selected field or their per-Gaussian mix, whichever agrees best with the
    check views: a field that agrees worse than the start anywhere is (partly) taken back."""
    from rh3dgs.lifting import LiftConfig, initial_field

    scene, maps, views = scene_maps
    lat0, dec, _ = initial_field(scene.gaussians, scene.cameras, maps, 4, LiftConfig())
    obj = SemanticObjective(ObjectiveConfig(use_lic=False), 4, 10)
    start = torch.nn.functional.normalize(lat0, dim=-1) * (lat0.abs().sum(-1, keepdim=True) > 0)
    ids, teacher = [2, 6], [maps[2], maps[6]]
    g = torch.Generator().manual_seed(0)
    noisy = start.clone()
    half = torch.rand(len(start), generator=g) < 0.5  # half of the Gaussians made wrong
    noisy[half] = torch.nn.functional.normalize(torch.randn(int(half.sum()), 4, generator=g), dim=-1)
    noisy = noisy * (start.abs().sum(-1, keepdim=True) > 0)
    out, info = select_field(obj, views, ids, dec, teacher, start, noisy, None)
    loss = {k: v for k, v in info["check_loss"].items()}
    assert loss["selected"] > loss["lift"] and info["choice"] in ("lift", "mixed")
    assert min(loss.values()) == loss[info["choice"]] <= loss["lift"]
    l, w = check_loss(obj, views, ids, out, torch.zeros(4), dec, teacher)
    assert float((l * w).sum() / w.sum()) == pytest.approx(loss[info["choice"]], rel=1e-5)
    if info["choice"] == "mixed":  # what was taken back is mostly what was made wrong
        back = (out == start).all(-1) & half & (start.abs().sum(-1) > 0)
        assert float(back.sum()) > 0.5 * float((half & (start.abs().sum(-1) > 0)).sum())


def test_distill_holds_out_the_check_views_and_reports_the_selection(scene_maps):
    scene, maps, views = scene_maps
    sel = SelectionConfig(check_fraction=0.25, check_every=4)
    res = distill(scene.gaussians, scene.cameras, maps, DistillConfig(
        steps=12, latent_dim=4, objective=ObjectiveConfig(selection=sel)), views=views)
    info = res.info
    assert info["check_views"] == [2, 6] and info["selection"]["choice"] in ("lift", "selected", "mixed")
    assert [s for s, _ in info["selection"]["check_history"]] == [4, 8, 12]
    losses = info["selection"]["check_loss"]
    assert losses[info["selection"]["choice"]] == min(losses.values()) <= losses["lift"]
    # training never reads the check views' maps: other maps there (and the same start) leave every training step's
    # loss as it was; only the selection sees them
    other = maps.clone()
    other[[2, 6]] = torch.nn.functional.normalize(torch.randn_like(other[[2, 6]]), dim=-1)
    again = distill(scene.gaussians, scene.cameras, other, DistillConfig(
        steps=12, latent_dim=4, objective=ObjectiveConfig(selection=sel)), init_lift=res.lift, views=views)
    assert [h["loss"] for h in again.history] == [h["loss"] for h in res.history]
    assert again.info["selection"]["check_loss"] != losses


def test_distill_refuses_check_views_with_checkpoints(scene_maps, tmp_path):
    """The check run's best step is not part of a checkpoint: a checkpointed run with the selection is one line,
    before any work."""
    scene, maps, views = scene_maps
    cfg = DistillConfig(steps=4, latent_dim=4, objective=ObjectiveConfig(selection=SelectionConfig(check_fraction=0.25)))
    with pytest.raises(ConfigError, match="objective.selection"):
        distill(scene.gaussians, scene.cameras, maps, cfg, views=views, checkpoint=tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
