"""nerfstudio integration: ``ns-train rh3dgs`` / ``rh3dgs-lite`` (rh3dgs.nerfstudio).

Fast tests build the pipeline on a small synthetic scene and check the pieces (latents in
the densification strategy, CPU-safe LPIPS, losses and metrics, the relevancy hook, frame
transforms). Slow tests run the real ``ns-train`` CLI on CPU, ``ns-eval`` on its checkpoint,
and reload the run with :func:`rh3dgs.io.nerfstudio_run.load_nerfstudio_scene`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

from rh3dgs.nerfstudio import METHOD_CONFIGS_ENV, METHOD_ENTRY_POINTS  # noqa: E402
from _scenes import synthetic_dataset

VENV_BIN = Path(sys.executable).parent


def _ns_env() -> dict:
    """Environment for nerfstudio subprocesses: register the methods through
    NERFSTUDIO_METHOD_CONFIGS unless the entry point is installed."""
    env = dict(os.environ)
    names = set(entry_points(group="nerfstudio.method_configs").names)
    if not {e.split("=")[0].strip() for e in METHOD_ENTRY_POINTS} <= names:
        env["NERFSTUDIO_METHOD_CONFIGS"] = METHOD_CONFIGS_ENV
    env.setdefault("OMP_NUM_THREADS", str(max(1, min(2, os.cpu_count() or 1))))
    return env


def _make_dataset(root: Path, views: int = 8, size: int = 64, density: float = 6000.0, heldout: int = 0) -> Path:
    """A synthetic dataset with a simulated teacher; ``heldout`` > 0: that many held-out views (the eval split)."""
    return synthetic_dataset(root, views, size, density, heldout_views=heldout)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    return _make_dataset(tmp_path_factory.mktemp("ns_small") / "scene", views=10, size=32, density=800.0)


def _lite(data: Path, out: Path, steps: int = 5):
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = data
    c.pipeline.datamanager.teacher_cache_dir = out / "teacher_cache"
    c.output_dir = out
    c.machine.device_type = "cpu"
    c.vis = "tensorboard"
    c.max_num_iterations = steps
    c.steps_per_save = steps
    return c


@pytest.fixture(scope="module")
def pipeline(small_data, tmp_path_factory):
    c = _lite(small_data, tmp_path_factory.mktemp("ns_pipe"))
    c.pipeline.model.max_init_points = 1500
    pipe = c.pipeline.setup(device="cpu", test_mode="val")
    from nerfstudio.engine.optimizers import Optimizers

    opt = Optimizers(c.optimizers, pipe.get_param_groups())
    pipe.model.optimizers = opt.optimizers
    return pipe, opt


# ---------------------------------------------------------------------------- registration
def test_method_specifications():
    from nerfstudio.plugins.types import MethodSpecification

    from rh3dgs.nerfstudio import config as nc
    from rh3dgs.nerfstudio.model import Rh3dgsModelConfig
    from rh3dgs.nerfstudio.splatfacto_native import SplatfactoNativeModel, SplatfactoNativeModelConfig

    for spec, name in ((nc.rh3dgs_method, "rh3dgs"), (nc.rh3dgs_lite_method, "rh3dgs-lite")):
        assert isinstance(spec, MethodSpecification)
        assert spec.config.method_name == name
        assert isinstance(spec.config.pipeline.model, Rh3dgsModelConfig)
        assert {"latents", "decoder", "means"} <= set(spec.config.optimizers)
    assert nc.rh3dgs_lite_method.config.max_num_iterations <= 1000
    assert nc.rh3dgs_method.config.pipeline.model.use_absgrad is False
    # the plain twins: the same schedules, splatfacto's model and optimizer groups only
    for plain, ours in ((nc.splatfacto_native_method, nc.rh3dgs_method),
                        (nc.splatfacto_native_lite_method, nc.rh3dgs_lite_method)):
        model = plain.config.pipeline.model
        assert type(model) is SplatfactoNativeModelConfig and model._target is SplatfactoNativeModel
        assert plain.config.method_name == ours.config.method_name.replace("rh3dgs", "splatfacto-native")
        assert set(plain.config.optimizers) == set(ours.config.optimizers) - {"latents", "decoder", "background_latent"}
        assert plain.config.max_num_iterations == ours.config.max_num_iterations
        for f in dataclasses.fields(SplatfactoNativeModelConfig):
            assert getattr(model, f.name) == getattr(ours.config.pipeline.model, f.name) or f.name == "_target", f.name
    # every method is registered by setup.py's entry points and by the environment variable
    setup_py = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    for entry in METHOD_ENTRY_POINTS:
        assert f'"{entry}"' in setup_py, entry
        assert entry.replace(" ", "") in METHOD_CONFIGS_ENV.split(",")


@pytest.mark.slow
def test_ns_train_help():
    r = subprocess.run([str(VENV_BIN / "ns-train"), "rh3dgs", "--help"], env=_ns_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "latent-dim" in r.stdout and "lambda-sem" in r.stdout
    r = subprocess.run([str(VENV_BIN / "ns-train"), "splatfacto-native-lite", "--help"], env=_ns_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "max-init-points" in r.stdout and "latent-dim" not in r.stdout


# ---------------------------------------------------------------------------- model pieces
def test_pipeline_builds_on_cpu_without_lpips_download(pipeline):
    pipe, _ = pipeline
    m = pipe.model
    assert m.device.type == "cpu"
    assert "latents" in m.gauss_params and m.latents.shape == (m.num_points, m.config.latent_dim)
    D = pipe.datamanager.teacher_map("train", 0).shape[-1]
    assert m.decoder.shape == (D, m.config.latent_dim)
    assert m.semantics_initialized
    # LPIPS is not a submodule: the state dict does not depend on its availability
    assert not any("lpips" in k for k in m.state_dict())
    if m.config.lpips == "auto":
        from rh3dgs.nerfstudio.splatfacto_native import alexnet_weights_available as _alexnet_weights_available

        if not _alexnet_weights_available():
            assert torch.isnan(m.lpips(torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)))


def test_train_step_outputs_losses_and_strategy_info(pipeline):
    pipe, opt = pipeline
    m = pipe.model
    m.train()
    m.step = 200
    cam, batch = pipe.datamanager.next_train(m.step)
    H, W = batch["image"].shape[:2]
    native = pipe.datamanager.teacher_map("train", 0).shape
    assert batch["teacher"].shape[:2] == m.teacher_size((H, W), native) == tuple(native[:2])  # the teacher's grid
    out = m(cam)
    assert out["rgb"].shape == (H, W, 3) and out["latents"].shape == (H, W, m.config.latent_dim)
    info = m.info
    assert {"means2d", "radii", "width", "height", "n_cameras"} <= set(info)
    assert info["means2d"].shape == (1, m.num_points, 2) and info["radii"].shape == (1, m.num_points)
    metrics = m.get_metrics_dict(out, batch)
    assert 0 < float(metrics["sem_cos"]) <= 1 and "psnr" in metrics
    losses = m.get_loss_dict(out, batch, metrics)
    assert "semantic_loss" in losses and "lic_loss" in losses and m.config.objective.use_lic  # LIC: on by default
    g_lic = torch.autograd.grad(losses["lic_loss"], [m.latents], retain_graph=True)[0]
    assert float(losses["lic_loss"]) > 0 and g_lic.abs().sum() > 0  # positives from the Gaussians' colours
    # the semantic loss alone reaches the latents, although the metrics (no_grad) ran first, and by default not the
    # geometry (semantic_geometry_grad=False: RGB alone shapes the Gaussians); with the option on, it does
    g_lat, g_means = torch.autograd.grad(losses["semantic_loss"], [m.latents, m.means], retain_graph=True)
    assert g_lat.abs().sum() > 0 and g_means.abs().sum() == 0
    try:
        m.config.semantic_geometry_grad = True
        out_g = m(cam)
        g_lat_g, g_means_g = torch.autograd.grad(m.get_loss_dict(out_g, batch)["semantic_loss"], [m.latents, m.means])
        assert g_means_g.abs().sum() > 0
        torch.testing.assert_close(g_lat_g, g_lat)  # the latents' own gradient is the same either way
    finally:
        m.config.semantic_geometry_grad = False
    loss = sum(losses.values())
    assert torch.isfinite(loss)
    loss.backward()
    # the strategy reads means2d.grad (retain_grad from step_pre_backward)
    assert info["means2d"].grad is not None and info["means2d"].grad.abs().sum() > 0
    assert m.latents.grad is not None and m.latents.grad.abs().sum() > 0
    assert m.decoder.grad is not None and m.decoder.grad.abs().sum() > 0
    assert m.objective.background.grad is not None and m.objective.background.grad.abs().sum() > 0
    m.strategy._update_state(m.gauss_params, m.strategy_state, info, packed=False)
    assert m.strategy_state["grad2d"].shape == (m.num_points,)
    opt.zero_grad_all()


def test_one_training_step_on_each_device(pipeline, device):
    """One rh3dgs-lite step as nerfstudio's trainer runs it (forward, losses, backward, optimizer step, the
    densification callback) on each device present. CPU: the module's pipeline. CUDA: a pipeline built on the GPU
    (its semantic init: the lift on CUDA) holding the CPU model's state, whose outputs, RGB and semantic losses and
    gradients match the CPU step's on the same view (values within 1e-4 relative, gradients 1e-3 of the largest)."""
    from nerfstudio.engine.callbacks import TrainingCallbackAttributes, TrainingCallbackLocation
    from nerfstudio.engine.optimizers import Optimizers

    pipe, opt = pipeline
    ref = pipe.model
    ref.train()
    if device.type == "cpu":
        model, optimizers = ref, opt
    else:
        c = _lite(pipe.datamanager.config.data, Path(pipe.datamanager.config.teacher_cache_dir).parent)
        c.pipeline.model.max_init_points = 1500
        dev_pipe = c.pipeline.setup(device=str(device), test_mode="val")
        model = dev_pipe.model
        model.load_state_dict({k: v.to(device) for k, v in ref.state_dict().items()})
        model.train()
        optimizers = Optimizers(c.optimizers, dev_pipe.get_param_groups())
        model.optimizers = optimizers.optimizers
        assert model.means.device.type == device.type and model.num_points == ref.num_points
    model.step = ref.step = 200
    cam, batch = pipe.datamanager.next_train(ref.step)
    runs = []
    for m in ([ref, model] if model is not ref else [ref]):
        out = m(cam.to(m.device))
        losses = m.get_loss_dict(out, batch, m.get_metrics_dict(out, batch))
        keep = [k for k in losses if k != "lic_loss"]  # LIC samples its anchors from the device's generator
        loss = sum(losses[k] for k in keep) + losses["lic_loss"]
        assert torch.isfinite(loss)
        loss.backward()
        runs.append(({k: losses[k].detach().cpu() for k in keep}, {k: out[k].detach().cpu() for k in ("rgb", "latents")},
                     {k: m.gauss_params[k].grad.cpu() for k in ("means", "latents", "opacities")},
                     m.decoder.grad.cpu()))
    if len(runs) == 2:
        (l_ref, o_ref, g_ref, d_ref), (l_dev, o_dev, g_dev, d_dev) = runs
        for k in l_ref:
            assert abs(float(l_dev[k] - l_ref[k])) <= 1e-4 * max(1.0, abs(float(l_ref[k]))), k
        for k in o_ref:
            assert (o_dev[k] - o_ref[k]).abs().max() <= 1e-4, k
        for k, g in list(g_ref.items()) + [("decoder", d_ref)]:
            other = d_dev if k == "decoder" else g_dev[k]
            assert g.abs().max() > 0 and (other - g).abs().max() <= 1e-3 * g.abs().max(), k
    n = model.num_points
    assert model.latents.grad.abs().sum() > 0 and model.means.grad.abs().sum() > 0
    optimizers.optimizer_step_all()
    attrs = TrainingCallbackAttributes(optimizers=optimizers, grad_scaler=None, pipeline=None, trainer=None)
    for cb in model.get_training_callbacks(attrs):
        if TrainingCallbackLocation.AFTER_TRAIN_ITERATION in cb.where_to_run:
            cb.run_callback_at_location(model.step, TrainingCallbackLocation.AFTER_TRAIN_ITERATION)
    assert model.latents.shape[0] == model.means.shape[0] == model.num_points and model.num_points >= n // 2
    optimizers.zero_grad_all()
    opt.zero_grad_all()


def test_semantic_loss_is_the_objective_of_distill(pipeline):
    """The model's semantic terms are :class:`rh3dgs.method.objective.SemanticObjective`'s on the render (the objective
    of ``distill()``), and the loss and the metrics do not depend on the order the hooks are called in."""
    from rh3dgs.nerfstudio.pipeline import train_cameras_as_rh3dgs
    from rh3dgs.method.objective import SemanticObjective
    from rh3dgs.rendering import render

    pipe, opt = pipeline
    m = pipe.model
    assert isinstance(m.objective, SemanticObjective) and m.objective.cfg is m.config.objective
    m.train()
    m.step = 201
    cam, batch = pipe.datamanager.next_train(m.step)
    out = m(cam)
    loss_first = m.get_loss_dict(out, batch)["semantic_loss"]
    metrics_after = m.get_metrics_dict(out, batch)
    out2 = m(cam)
    metrics_first = m.get_metrics_dict(out2, batch)
    loss_after = m.get_loss_dict(out2, batch)["semantic_loss"]
    assert torch.equal(loss_first, loss_after)
    assert torch.equal(metrics_after["sem_cos"], metrics_first["sem_cos"])
    assert torch.equal(metrics_after["sem_cos_vcd"], metrics_first["sem_cos_vcd"])
    # the same number from the objective called as distill() calls it, on a render of the same camera
    with torch.no_grad():
        r = render(m.gaussians_for_render(detach=True), train_cameras_as_rh3dgs(cam),
                   m.semantic_latents(m.latents.detach()), rgb=False)
        ref, _ = m.objective(m.step, r.features, r.alpha, r.d1, r.d2, m.decoder, batch["teacher"][None])
    torch.testing.assert_close(loss_after.detach(), ref, rtol=1e-4, atol=1e-6)
    g_lat, = torch.autograd.grad(loss_after, [m.latents])
    assert g_lat.abs().sum() > 0
    opt.zero_grad_all()


def test_semantic_metrics_only_on_logged_steps(pipeline):
    pipe, _ = pipeline
    m = pipe.model
    m.train()
    cam, batch = pipe.datamanager.next_train(0)
    try:
        m.metrics_every = 50  # the trainer's logging.steps_per_log (get_training_callbacks)
        m.step = 149
        metrics = m.get_metrics_dict(m(cam), batch)
        assert "psnr" in metrics and "sem_cos" not in metrics
        m.step = 150
        assert 0 < float(m.get_metrics_dict(m(cam), batch)["sem_cos"]) <= 1
        m.eval()  # evaluation always reports them
        m.step = 149
        with torch.no_grad():
            assert "sem_cos" in m.get_metrics_dict(m(cam), batch)
    finally:
        m.metrics_every = 1
        m.train()


def test_teacher_map_prepared_once_per_camera_at_the_comparison_size(pipeline):
    """batch["teacher"] is prepared once per camera at the comparison size; batch["teacher_regions"] (VCD's
    mask-specificity term) once per camera at the image size, from the map as the teacher gives it."""
    from rh3dgs.teachers.maps import prepare_map, region_fraction

    pipe, _ = pipeline
    m, dm = pipe.model, pipe.datamanager
    assert m.objective.uses_regions and dm.with_regions
    seen, seen_regions = {}, {}
    for step in range(2 * len(dm.train_dataset)):
        cam, batch = dm.next_train(step)
        idx = int(cam.metadata["cam_idx"])
        if idx in seen:
            assert batch["teacher"] is seen[idx]  # the same prepared tensor, not prepared again
            assert batch["teacher_regions"] is seen_regions[idx]
        seen[idx], seen_regions[idx] = batch["teacher"], batch["teacher_regions"]
    H, W = batch["image"].shape[:2]
    native = dm.teacher_map("train", idx)
    assert native.shape[0] < H  # patch tokens: compared at the teacher's grid, not upsampled
    assert tuple(batch["teacher"].shape[:2]) == tuple(native.shape[:2])
    assert torch.equal(batch["teacher"], native)  # as the teacher gives it (the objective normalises its rows)
    assert torch.equal(batch["teacher_regions"], region_fraction(native, (H, W)))
    # resolution='image': the map is handed upsampled to the image size, its regions stay those of the native map
    try:
        m.config.objective.resolution = "image"
        cam, batch = dm.next_train(0)
        native = dm.teacher_map("train", int(cam.metadata["cam_idx"]))
        assert tuple(batch["teacher"].shape[:2]) == (H, W)
        assert torch.equal(batch["teacher"], prepare_map(native, (H, W)))
        assert torch.equal(batch["teacher_regions"], region_fraction(native, (H, W)))
    finally:
        m.config.objective.resolution = "teacher"


def test_densification_carries_latents(pipeline):
    from gsplat.strategy.ops import duplicate, remove, split

    pipe, opt = pipeline
    m = pipe.model
    n = m.num_points
    state = {"grad2d": torch.zeros(n), "count": torch.zeros(n), "radii": torch.zeros(n)}
    with torch.no_grad():
        m.gauss_params["latents"][0] = torch.arange(m.config.latent_dim, dtype=torch.float32)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[0] = True
    duplicate(m.gauss_params, opt.optimizers, state, mask)
    assert m.latents.shape[0] == m.means.shape[0] == n + 1
    assert torch.equal(m.latents[-1], m.latents[0])
    split(m.gauss_params, opt.optimizers, state, torch.cat([mask, torch.zeros(1, dtype=torch.bool)]))
    assert m.latents.shape[0] == m.means.shape[0] == n + 2
    keep = torch.zeros(m.num_points, dtype=torch.bool)
    keep[-2:] = True
    remove(m.gauss_params, opt.optimizers, state, keep)
    assert m.latents.shape[0] == m.means.shape[0] == n
    # the optimizer follows the new parameter
    assert opt.optimizers["latents"].param_groups[0]["params"][0] is m.gauss_params["latents"]


def test_densification_that_keeps_n_rebuilds_the_lic_graph(pipeline, monkeypatch):
    """A densification step that adds as many Gaussians as it prunes keeps N but changes who is where: LIC's graph
    (neighbour indices) must be rebuilt; a step that changes nothing keeps it."""
    from gsplat.strategy.ops import duplicate, remove

    pipe, opt = pipeline
    m = pipe.model
    lic = m.objective.lic
    n = m.num_points
    state = {"grad2d": torch.zeros(n), "count": torch.zeros(n), "radii": torch.zeros(n)}

    def grow_and_prune(**kw):
        mask = torch.zeros(m.num_points, dtype=torch.bool)
        mask[0] = True
        duplicate(m.gauss_params, opt.optimizers, state, mask)
        drop = torch.zeros(m.num_points, dtype=torch.bool)
        drop[1] = True
        remove(m.gauss_params, opt.optimizers, state, drop)

    step = lic.cfg.warmup_steps + 1
    m.step = step
    colors = lambda: m.gaussians_for_render(detach=True).base_colors  # noqa: E731  (appearance positives)
    lic.refresh(m.means.detach(), m.latents.detach(), step, colors())
    monkeypatch.setattr(m.strategy, "step_post_backward", lambda **kw: None)
    m.step_post_backward(step)
    assert not lic.needs_refresh(step, n)  # nothing changed: the graph stays
    monkeypatch.setattr(m.strategy, "step_post_backward", grow_and_prune)
    m.step_post_backward(step)
    assert m.num_points == n and lic.needs_refresh(step, n)  # same N, other Gaussians: rebuilt at the next step
    assert lic.maybe_refresh(step, m.means.detach(), m.latents.detach(), colors()) and not lic.needs_refresh(step, n)


def test_eval_outputs_metrics_and_relevancy_hook(pipeline):
    pipe, _ = pipeline
    m = pipe.model
    m.eval()
    cam, batch = pipe.datamanager.fixed_indices_eval_dataloader[0]
    out = m.get_outputs_for_camera(cam)
    assert out["semantics"].shape[-1] == 3
    metrics, images = m.get_image_metrics_and_images(out, batch)
    assert {"psnr", "ssim", "sem_cos", "sem_cos_vcd"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert "semantics" in images
    D = m.decoder.shape[0]
    pos = torch.nn.functional.normalize(torch.randn(2, D), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(4, D), dim=-1)
    rel = m.relevancy_outputs(out, pos, neg)
    assert set(rel) == {"relevancy_0", "relevancy_1"}
    r0 = rel["relevancy_0"]
    assert r0.shape == (*out["latents"].shape[:2], 1) and float(r0.min()) >= 0 and float(r0.max()) <= 1
    # matches decoding every pixel then LERF relevancy
    from rh3dgs.query import feature_relevancy as relevancy

    z = m.decode(out["latents"])
    ref = relevancy(z, pos, neg)
    ok = out["latents"].norm(dim=-1) > 1e-3
    assert torch.allclose(torch.cat([rel["relevancy_0"], rel["relevancy_1"]], -1)[ok], ref[ok], atol=1e-4)
    m.train()


def test_viewer_path_does_not_use_compiled_viewmat(pipeline, monkeypatch):
    import nerfstudio.models.splatfacto as sf

    def boom(*a, **k):
        raise AssertionError("compiled get_viewmat called")

    monkeypatch.setattr(sf, "get_viewmat", boom)
    pipe, _ = pipeline
    m = pipe.model
    m.eval()
    cam, _ = pipe.datamanager.fixed_indices_eval_dataloader[0]
    out = m.get_outputs_for_camera(cam)
    assert torch.isfinite(out["rgb"]).all()
    m.train()


def test_rotate_sh_matches_rotated_evaluation():
    from rh3dgs.ops._gsplat import spherical_harmonics_torch as _spherical_harmonics

    from rh3dgs.io.nerfstudio_run import rotate_sh

    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(4), dim=0)
    w, x, y, z = q
    R = torch.tensor([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                      [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                      [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
    coeffs = torch.randn(5, 16, 3)
    rot = torch.cat([coeffs[:, :1], rotate_sh(coeffs[:, 1:], R)], 1)
    d = torch.nn.functional.normalize(torch.randn(5, 3), dim=-1)
    a = _spherical_harmonics(3, d, coeffs)
    b = _spherical_harmonics(3, d @ R.T, rot)  # color'(R d) == color(d)
    assert torch.allclose(a, b, atol=1e-4)


# ---------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("selection", [False, True], ids=["default", "selection"])
def test_ns_train_trains_the_field_distill_trains(tmp_path, selection):
    """Acceptance (issue 16): ``ns-train rh3dgs``'s model and pipeline, run by nerfstudio's Trainer on CPU, train a
    field whose held-out mIoU is within 1 point of :func:`rh3dgs.distill.distill`'s on the same scene, with the same
    objective (:class:`rh3dgs.method.objective.ObjectiveConfig` defaults), the same lift start, steps, learning rates and
    views per step.

    The geometry is frozen (``freeze_geometry``: no gradient to means / scales / quats / opacities, no
    densification) because ``distill()`` trains latents on fixed Gaussians: with the geometry learning too the two
    would solve different problems. Both therefore train on the model's initial Gaussians (the dataset's seed
    points as splatfacto initialises them), in nerfstudio's frame; what stays different is only the machinery
    (nerfstudio's optimizers and callbacks, one render pass with RGB vs distill's fixed compositing weights);
    distill() replays ns-train's camera order (``DistillConfig.view_order``). Scored on the 4 held-out views with
    :func:`rh3dgs.eval.scoring.score_views` (the suite's 2D scoring) against the ground-truth class masks. With the
    objective's selection (``selection``, :mod:`rh3dgs.method.selection`, off by default) both hold out the same two
    check views, start from the lift of the other views, choose the same way and refit on every view.
    """
    import numpy as np
    from PIL import Image

    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
    from rh3dgs.data.teacher_sim import simulate_teacher
    from dataclasses import replace

    from rh3dgs.distill import DistillConfig, distill
    from rh3dgs.eval.scoring import score_views
    from rh3dgs.method.selection import SelectionConfig, check_view_indices, fit_lift, lift_latents
    from rh3dgs.field import SemanticField
    from rh3dgs.nerfstudio.pipeline import train_cameras_as_rh3dgs
    from rh3dgs.rendering import render

    data = tmp_path / "scene"
    scene = make_scene(SceneConfig(num_views=12, heldout_views=4, image_size=48, gaussians_per_unit_area=1500.0))
    write_dataset(scene, data, progress=False)
    simulate_teacher(data, progress=False)  # the default (corrupted, patch-pooled) simulated teacher
    steps = 120
    c = _lite(data, tmp_path, steps=steps)
    c.steps_per_eval_image = c.steps_per_eval_all_images = 10 ** 6
    c.pipeline.model.freeze_geometry = True
    c.pipeline.model.max_init_points = None
    if selection:
        c.pipeline.model.objective = replace(c.pipeline.model.objective,
                                             selection=SelectionConfig(check_fraction=1 / 6))
    c.set_timestamp()
    trainer = c.setup(local_rank=0, world_size=1)
    trainer.setup()
    m, dm = trainer.pipeline.model, trainer.pipeline.datamanager
    g0 = m.gaussians_for_render(detach=True)[torch.arange(m.num_points)]  # a copy of what the lift ran on
    lat0 = m.latents.detach().clone()
    train_cams = train_cameras_as_rh3dgs(dm.train_dataset.cameras)
    maps = dm.teacher_maps("train")
    seen = []  # the cameras of ns-train's steps, replayed by distill() (the order alone moves this 48 px scene by 3 points)
    next_train = dm.next_train

    def recording(step):
        camera, data = next_train(step)
        seen.append(int(camera.metadata["cam_idx"]))
        return camera, data

    dm.next_train = recording
    trainer.train()
    assert len(seen) == steps
    assert m.step == steps - 1 and m.num_points == len(g0)
    assert torch.equal(m.means.detach(), g0.means) and torch.equal(m.opacities.detach()[:, 0], g0.opacities)
    assert not torch.equal(m.latents.detach(), lat0)  # trained

    opt = c.optimizers
    dcfg = DistillConfig(steps=steps, views_per_step=1, latent_dim=m.config.latent_dim,
                         lr=opt["latents"]["optimizer"].lr, decoder_lr=opt["decoder"]["optimizer"].lr,
                         background_lr=opt["background_latent"]["optimizer"].lr,
                         objective=m.config.objective, lift=m.config.lift, view_order=tuple(seen))
    ref = distill(g0, train_cams, maps, dcfg)
    start = m.objective.gaussian_latents(ref.lift.latents)
    ids = check_view_indices(len(train_cams), m.config.objective.selection.check_fraction)
    assert ids == ([3, 9] if selection else [])
    if ids:  # the selection's start: the lift of the views that are not check views (rh3dgs.method.selection)
        fit = fit_lift(g0, train_cams, maps, ids, replace(m.config.lift, latent_dim=m.config.latent_dim))
        start = torch.where(fit.valid[:, None], lift_latents(fit, ref.lift.decoder), start)
        assert m.selection_info["choice"] == ref.info["selection"]["choice"]
        assert m.selection_info["selected_step"] == ref.info["selected_step"]
    assert torch.allclose(start, lat0, atol=1e-5)  # the same start

    # held-out scoring (the eval split is the dataset's held-out views)
    cams = train_cameras_as_rh3dgs(dm.eval_dataset.cameras)
    stems = [p.stem for p in dm.eval_dataset._dataparser_outputs.image_filenames]
    assert len(stems) == 4 and all(int(s.split("_")[1]) >= 12 for s in stems)
    gt = [np.asarray(Image.open(data / "masks" / f"{s}.png")).astype(np.int64) for s in stems]
    emb = np.load(data / "features" / "text_embeddings.npz")
    text = torch.nn.functional.normalize(torch.from_numpy(np.stack([emb[n] for n in scene.class_names])).float(), dim=-1)

    def held_out_miou(lat, dec):
        with torch.no_grad():
            r = render(g0, cams, lat, rgb=False)
        return score_views(SemanticField(lat, dec), list(r.features), list(r.alpha), gt, text)["miou"]

    ours = held_out_miou(m.semantic_latents(m.latents.detach()), m.decoder.detach())
    theirs = held_out_miou(ref.latents, ref.decoder)
    lift = held_out_miou(ref.lift.latents, ref.lift.decoder)
    print(f"held-out mIoU: ns-train {100 * ours:.2f}, distill {100 * theirs:.2f}, lift {100 * lift:.2f}")
    assert abs(ours - theirs) <= 0.01, (ours, theirs)
    assert ours > 0.3 and ours != lift


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """Real ``ns-train rh3dgs-lite`` on CPU (64 x 64, 12 training views, 8 held-out ones: ns-eval's split);
    -> (config.yml, seconds, data dir)."""
    root = tmp_path_factory.mktemp("ns_train")
    data = _make_dataset(root / "scene", views=12, size=64, heldout=8)
    out = root / "outputs"
    cmd = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
           "--output-dir", str(out), "--experiment-name", "synth", "--timestamp", "run",
           "--viewer.quit-on-train-completion", "True",
           "--pipeline.datamanager.teacher-cache-dir", str(root / "cache"), "--data", str(data)]
    t0 = time.time()
    r = subprocess.run(cmd, env=_ns_env(), capture_output=True, text=True, timeout=900, cwd=root)
    seconds = time.time() - t0
    (root / "ns-train.log").write_text(r.stdout + "\n" + r.stderr)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    cfg = out / "synth" / "rh3dgs-lite" / "run" / "config.yml"
    assert cfg.is_file()
    print(f"ns-train rh3dgs-lite: {seconds:.1f} s")
    return cfg, seconds, data


def _ns_eval(cfg: Path) -> dict:
    out_json = cfg.parent / "eval.json"
    r = subprocess.run([str(VENV_BIN / "ns-eval"), "--load-config", str(cfg), "--output-path", str(out_json)],
                       env=_ns_env(), capture_output=True, text=True, timeout=600, cwd=cfg.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out_json.read_text())["results"]


@pytest.mark.slow
def test_ns_train_lite_cpu_then_ns_eval(trained_run):
    cfg, seconds, _ = trained_run
    # acceptance: < 10 min on 2 cores (CI runs the suite alone on such a machine)
    assert seconds < 600, f"ns-train rh3dgs-lite took {seconds:.0f} s"
    ckpts = list((cfg.parent / "nerfstudio_models").glob("step-*.ckpt"))
    assert ckpts
    # checkpoints are weights_only-safe (torch >= 2.6 default in nerfstudio's own loaders)
    torch.load(ckpts[0], map_location="cpu", weights_only=True)
    res = _ns_eval(cfg)
    print("ns-eval:", {k: res[k] for k in res if not k.endswith("_std")})
    assert res["psnr"] > 20.0
    assert res["sem_cos"] > 0.5 and res["sem_cos_vcd"] > 0.7


@pytest.mark.slow
def test_ns_train_says_its_eta_after_the_first_iterations(trained_run):
    cfg, _, _ = trained_run
    log = (cfg.parents[4] / "ns-train.log").read_text()
    assert "ETA for 300 iterations:" in log, log[-3000:]


@pytest.mark.slow
def test_semantic_training_keeps_rgb_psnr_of_plain_splatfacto(trained_run):
    """Held-out PSNR of rh3dgs-lite vs the same model, data and budget without semantic losses
    (``lambda_sem = lambda_con = 0``: splatfacto's model and losses; nerfstudio's own ``splatfacto``
    needs gsplat's CUDA rasterizer and cannot run on a CPU machine), both trained in this run.

    Both runs see the same initial Gaussians (machine seed) and camera order (the datamanager's seeded
    sampler), so the difference is the semantic loss's gradients on the geometry. The PSNR is the mean over
    the dataset's 8 held-out views: with nerfstudio's 90 / 10 split of 12 views it was ONE image, whose PSNR
    moves by ~1 dB between two plain runs that differ only in the initial quaternions (seed 42 vs 43:
    24.29 / 25.33 dB). When the semantic loss moved the geometry too (``semantic_geometry_grad=True``) the
    semantic run cost 0.15-0.4 dB; by default it does not, and the geometry's training is splatfacto's own:
    the same PSNR to the third decimal (29.257 / 29.257 dB), so the bound is 0.01 dB."""
    cfg, _, data = trained_run
    root = cfg.parents[4]
    out = root / "outputs_plain"
    cmd = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
           "--output-dir", str(out), "--experiment-name", "synth", "--timestamp", "run",
           "--viewer.quit-on-train-completion", "True", "--pipeline.model.objective.lambda-sem", "0",
           "--pipeline.model.objective.lambda-con", "0", "--pipeline.datamanager.teacher-cache-dir", str(root / "cache"),
           "--data", str(data)]
    r = subprocess.run(cmd, env=_ns_env(), capture_output=True, text=True, timeout=900, cwd=root)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    plain = _ns_eval(out / "synth" / "rh3dgs-lite" / "run" / "config.yml")
    ours = json.loads((cfg.parent / "eval.json").read_text())["results"] if (cfg.parent / "eval.json").is_file() \
        else _ns_eval(cfg)
    print(f"held-out PSNR: rh3dgs-lite {ours['psnr']:.3f} dB, without semantics {plain['psnr']:.3f} dB")
    assert abs(ours["psnr"] - plain["psnr"]) <= 0.01


@pytest.mark.slow
def test_load_nerfstudio_scene_and_export(trained_run, tmp_path):
    from rh3dgs.io.ply import load_ply
    from rh3dgs.io.nerfstudio_run import export_semantic_ply, load_nerfstudio_scene
    from rh3dgs.rendering import render

    cfg, _, data = trained_run
    g, dec, cams, spec = load_nerfstudio_scene(cfg)
    assert g.latents is not None and g.latents.shape[1] == dec.shape[1] == 8
    assert dec.shape[0] == 64  # teacher dim of the simulated teacher
    assert cams is not None and len(cams) == 12 + 8  # every camera of transforms.json, held-out ones included
    assert spec["name"] == "precomputed" and Path(spec["features_dir"]) == data / "features"
    # the data frame and the training frame render the same images
    g_ns, _, cams_ns, _ = load_nerfstudio_scene(cfg, frame="nerfstudio")
    a = render(g, cams[:2], g.latents)
    b = render(g_ns, cams_ns[:2], g_ns.latents)
    # Rounding in the frame transform can flip a pixel's alpha >= 1/255 or T <= 1e-4 decision
    # (one such pixel differs by ~1e-2 in a seen run, 5e-3 in RGB in another): the mean error is tiny
    # and flips are isolated.
    drgb = (a.rgb - b.rgb).abs()
    assert drgb.mean() < 1e-5 and (drgb > 2e-3).float().mean() < 1e-3 and drgb.max() < 0.05, float(drgb.max())
    scale = float(b.features.abs().max().clamp_min(1.0))
    diff = (a.features - b.features).abs()
    assert diff.mean() < 1e-5 * scale, float(diff.mean())
    assert (diff > 1e-3 * scale).float().mean() < 1e-3, float((diff > 1e-3 * scale).float().mean())
    assert diff.max() < 0.05 * scale
    # training images are reproduced in the data frame (PSNR on the training views)
    from PIL import Image
    import numpy as np

    gt = torch.from_numpy(np.asarray(Image.open(data / "images" / "frame_00001.png").convert("RGB"))).float() / 255
    mse = ((a.rgb[1].clamp(0, 1) - gt) ** 2).mean()
    assert -10 * math.log10(float(mse)) > 14.0
    ply = export_semantic_ply(cfg, tmp_path / "semantic.ply")
    back = load_ply(ply)
    assert torch.equal(back.latents, g.latents) and len(back) == len(g)  # float32 on disk (the default)
    assert np.load(str(ply.with_suffix(".decoder.npy"))).shape == tuple(dec.shape)
    # the Python API opens the run directly and answers text queries
    import rh3dgs

    scene = rh3dgs.load(cfg)
    assert len(scene) == len(g) and scene.field.latent_dim == 8
    rel = scene.render_relevancy(1, ["red ball", "blue box"])
    assert rel.shape == (2, 64, 64) and 0 <= float(rel.min()) and float(rel.max()) <= 1


@pytest.mark.slow
def test_a_run_written_before_the_package_was_regrouped_still_loads(trained_run, tmp_path):
    """A run folder whose config.yml was written at commit 6cdebc9 (``fixtures/config_6cdebc9.yml``: it names
    ``rh3dgs.lifting.LiftConfig``, ``rh3dgs.vcd.VCDConfig``, ``rh3dgs.objective.ObjectiveConfig``, modules that moved
    into ``rh3dgs/lifting/`` and ``rh3dgs/method/``) loads into the same scene as today's config of that run."""
    import shutil

    import rh3dgs

    cfg, _, data = trained_run
    run = tmp_path / "run"
    shutil.copytree(cfg.parent, run)
    text = (Path(__file__).parent / "fixtures" / "config_6cdebc9.yml").read_text()
    line = "data: &id003 !!python/object/apply:pathlib.PosixPath\n- data\n"
    assert line in text
    (run / "config.yml").write_text(text.replace(line, line.replace("- data", f"- {data}")))
    old, new = rh3dgs.load(run / "config.yml"), rh3dgs.load(cfg)
    assert torch.equal(old.gaussians.means, new.gaussians.means)
    assert torch.equal(old.field.latents, new.field.latents) and torch.equal(old.field.decoder, new.field.decoder)
    assert torch.equal(old.render_relevancy(1, ["red ball"]), new.render_relevancy(1, ["red ball"]))


@pytest.mark.slow
def test_resume_from_checkpoint_keeps_optimizing_the_loaded_parameters(trained_run, tmp_path):
    """``--load-dir`` resume: torch.load of the checkpoint and the optimizers bound to the loaded Gaussians."""
    from rh3dgs.io.nerfstudio_run import find_checkpoint, load_run_config

    cfg_path, _, _ = trained_run
    c = load_run_config(cfg_path)
    ckpt = find_checkpoint(cfg_path, c)
    before = torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]
    c.load_dir = ckpt.parent
    c.output_dir = tmp_path
    c.vis = "tensorboard"
    c.max_num_iterations = 3
    c.steps_per_save = 1000
    c.steps_per_eval_image = 1000
    c.set_timestamp()
    trainer = c.setup(local_rank=0, world_size=1)
    trainer.setup()
    m = trainer.pipeline.model
    assert torch.equal(m.means.detach(), before["_model.gauss_params.means"])
    opt_means = trainer.optimizers.optimizers["means"].param_groups[0]["params"][0]
    assert opt_means is m.gauss_params["means"]
    trainer.train()
    assert not torch.equal(m.latents.detach(), before["_model.gauss_params.latents"])


def test_training_guards_stop_or_skip_on_non_finite(pipeline):
    """A NaN in the latents: training stops with a clear NonFiniteError, or the batch is skipped."""
    from rh3dgs.errors import NonFiniteError

    pipe, opt = pipeline
    m = pipe.model
    m.train()
    m.step = 200
    saved = m.gauss_params["latents"].data[0].clone()
    try:
        m.gauss_params["latents"].data[0] = float("nan")
        cam, batch = pipe.datamanager.next_train(m.step)
        # parameter check (step is a multiple of check_params_every)
        with pytest.raises(NonFiniteError, match="parameter 'latents'.*last saved checkpoint"):
            m.get_loss_dict(m(cam), batch)
        m.step = 201  # not a parameter-check step: the non-finite loss itself is caught
        with pytest.raises(NonFiniteError, match="non-finite .*skip-nonfinite-batches"):
            m.get_loss_dict(m(cam), batch)
        m.config.skip_nonfinite_batches = True
        losses = m.get_loss_dict(m(cam), batch)
        total = sum(losses.values())
        assert float(total) == 0.0
        total.backward()
        assert torch.isfinite(m.info["means2d"].grad).all() and m.info["means2d"].grad.abs().sum() == 0
        opt.zero_grad_all()
    finally:
        m.config.skip_nonfinite_batches = False
        m.gauss_params["latents"].data[0] = saved
        m._skipped_in_a_row = 0


# ---------------------------------------------------------------------------- kill and resume
@pytest.mark.slow
def test_ns_train_killed_then_resumed(small_data, tmp_path):
    """SIGKILL ``ns-train rh3dgs-lite`` while it trains and saves, re-run with ``--load-dir``: every
    ``.ckpt`` left behind is complete, a broken newest one is skipped by name, the run finishes."""
    import random
    import signal

    from rh3dgs.io.nerfstudio_run import checkpoints_newest_first

    out = tmp_path / "outputs"
    models = out / "k" / "rh3dgs-lite" / "run" / "nerfstudio_models"
    base = [str(VENV_BIN / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis", "tensorboard",
            "--output-dir", str(out), "--experiment-name", "k", "--timestamp", "run",
            "--max-num-iterations", "80", "--steps-per-save", "5", "--viewer.quit-on-train-completion", "True",
            "--pipeline.datamanager.teacher-cache-dir", str(tmp_path / "cache")]

    def cmd():
        resume = ["--load-dir", str(models)] if models.is_dir() and checkpoints_newest_first(models) else []
        return base + resume + ["--data", str(small_data)]

    def all_complete():
        for step, p in checkpoints_newest_first(models):
            state = torch.load(p, map_location="cpu", weights_only=True)
            assert state["step"] == step, p

    rng = random.Random(0)
    steps_seen = []
    for i in range(3):
        before = checkpoints_newest_first(models) if models.is_dir() else []
        log = tmp_path / f"kill{i}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(cmd(), env=_ns_env(), stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path)
            t0 = time.monotonic()
            # wait for this run's first new checkpoint, then kill at a random moment of the next saves
            while proc.poll() is None and (not models.is_dir() or checkpoints_newest_first(models) == before):
                assert time.monotonic() - t0 < 600, log.read_text()[-3000:]
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 1.5))
            assert proc.poll() is None, ("finished before the kill", log.read_text()[-3000:])
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        all_complete()
        steps_seen.append(checkpoints_newest_first(models)[0][0])
    assert steps_seen == sorted(steps_seen) and steps_seen[-1] > steps_seen[0], steps_seen  # each run resumed
    # a broken newest checkpoint (a save cut short by hand) is skipped, not loaded
    newest_step, newest = checkpoints_newest_first(models)[0]
    broken = models / f"step-{newest_step + 1:09d}.ckpt"
    broken.write_bytes(newest.read_bytes()[:1000])
    r = subprocess.run(cmd(), env=_ns_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    said = (r.stdout + r.stderr).replace("\n", "")  # rich wraps long lines
    assert "Skipping unreadable checkpoint" in said and broken.name in said
    assert f"Resumed from {newest}" in said
    final = checkpoints_newest_first(models)
    # nerfstudio's --load-dir runs max_num_iterations more steps: newest_step + 1 .. newest_step + 80
    assert final[0][0] == newest_step + 80 and not broken.exists()
    all_complete()
