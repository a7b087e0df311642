"""rh3dgs.nerfstudio.splatfacto_native: splatfacto on rh3dgs's rasterizer, pinned to the nerfstudio it was copied
from, and ``semantics=False`` building exactly it.

Models are built directly from their configs on a small random seed cloud (no dataset): the base
class against splatfacto's own camera maths and against :func:`rh3dgs.rendering.render`, and the
semantic model as the base class plus latents and decoder (same RGB from the same Gaussians).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

from nerfstudio.cameras.cameras import Cameras as NSCameras  # noqa: E402
from nerfstudio.data.scene_box import SceneBox  # noqa: E402

from rh3dgs.nerfstudio.model import Rh3dgsModel, Rh3dgsModelConfig  # noqa: E402
from rh3dgs.nerfstudio.splatfacto_native import (  # noqa: E402
    NERFSTUDIO_VERSION,
    SPLATFACTO_SOURCES,
    SplatfactoNativeModel,
    SplatfactoNativeModelConfig,
    viewmat_from_c2w,
)

SPLATFACTO_GROUPS = {"means", "scales", "quats", "features_dc", "features_rest", "opacities"}


def _build(cfg, n: int = 300):
    g = torch.Generator().manual_seed(0)
    pts = (torch.rand(n, 3, generator=g) - 0.5) * 0.8
    cols = (torch.rand(n, 3, generator=g) * 255).to(torch.uint8)
    cfg.background_color = "black"
    return cfg.setup(scene_box=SceneBox(aabb=torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])), num_train_data=2,
                     metadata={}, seed_points=(pts, cols))


def _camera(size: int = 24) -> NSCameras:
    c2w = torch.tensor([[[1.0, 0.0, 0.0, 0.05], [0.0, 1.0, 0.0, -0.02], [0.0, 0.0, 1.0, 2.0]]])  # looks down -z
    return NSCameras(camera_to_worlds=c2w, fx=float(size), fy=float(size), cx=size / 2, cy=size / 2,
                     width=size, height=size)


def test_viewmat_is_splatfactos_get_viewmat_without_compile():
    import nerfstudio.models.splatfacto as sf

    orig = getattr(sf.get_viewmat, "_torchdynamo_orig_callable", None)
    if orig is None:
        pytest.skip("this torch's compiled function does not expose the original callable")
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(5, 4), dim=-1)
    w, x, y, z = q.unbind(-1)
    R = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(5, 3, 3)
    c2w = torch.cat([R, torch.randn(5, 3, 1)], -1)
    assert torch.equal(viewmat_from_c2w(c2w), orig(c2w))


def _upstream_source(name: str) -> str:
    """The source text of ``name`` ("get_viewmat", "SplatfactoModel.get_outputs") in the installed nerfstudio's
    ``models/splatfacto.py`` (read from the file: ``get_viewmat`` is ``torch.compile``-d)."""
    import ast
    import importlib.util
    from pathlib import Path

    src = Path(importlib.util.find_spec("nerfstudio.models.splatfacto").origin).read_text()
    body, node = ast.parse(src).body, None
    for part in name.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        assert node is not None, f"nerfstudio's splatfacto has no {name} any more"
        body = node.body
    return ast.get_source_segment(src, node)


@pytest.mark.parametrize("name", sorted(SPLATFACTO_SOURCES))
def test_copied_splatfacto_methods_are_pinned_to_their_nerfstudio(name):
    """An upgraded nerfstudio says which of splatfacto's methods changed under the copies and wrappers here."""
    import hashlib
    from importlib.metadata import version

    digest, where = SPLATFACTO_SOURCES[name]
    now = hashlib.sha256(_upstream_source(name).encode()).hexdigest()[:16]
    assert now == digest, (f"nerfstudio {version('nerfstudio')}'s splatfacto {name} is not the one of nerfstudio "
                           f"{NERFSTUDIO_VERSION} ({where}): re-copy it, then update SPLATFACTO_SOURCES")
    assert version("nerfstudio") == NERFSTUDIO_VERSION


def test_building_a_model_starts_nothing(monkeypatch):
    """populate_modules only builds modules: the viewer's guard is installed by the pipeline."""
    from rh3dgs.nerfstudio import viewer
    from rh3dgs.viewer import guard

    calls = []
    monkeypatch.setattr(guard, "install", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(viewer, "install_viewer_guard", lambda *a, **k: calls.append(a))
    _build(SplatfactoNativeModelConfig())
    _build(Rh3dgsModelConfig(latent_dim=4))
    assert not calls


def test_semantics_false_builds_exactly_the_base_class():
    import yaml

    assert Rh3dgsModelConfig(semantics=False)._target is SplatfactoNativeModel  # what setup() builds
    assert Rh3dgsModelConfig()._target is Rh3dgsModel
    assert dataclasses.replace(Rh3dgsModelConfig(semantics=False), semantics=True)._target is Rh3dgsModel
    # a run's config.yml written with semantics off before it set _target (read back by ns-eval, ns-viewer)
    text = yaml.dump(Rh3dgsModelConfig()).replace("semantics: true", "semantics: false")
    assert "_target: !!python/name:rh3dgs.nerfstudio.model.Rh3dgsModel" in text
    assert yaml.load(text, Loader=yaml.Loader)._target is SplatfactoNativeModel
    base = _build(Rh3dgsModelConfig(semantics=False))
    sem = _build(Rh3dgsModelConfig())
    plain = _build(SplatfactoNativeModelConfig())
    assert type(base) is SplatfactoNativeModel and type(plain) is SplatfactoNativeModel
    assert type(sem) is Rh3dgsModel and isinstance(sem, SplatfactoNativeModel)
    # splatfacto's parameter groups; the semantic model adds exactly latents, decoder and the objective's
    # background latent
    assert set(base.get_param_groups()) == set(plain.get_param_groups()) == SPLATFACTO_GROUPS
    assert set(sem.get_param_groups()) == SPLATFACTO_GROUPS | {"latents", "decoder", "background_latent"}
    extra = set(sem.state_dict()) - set(base.state_dict())
    assert extra == {"gauss_params.latents", "decoder", "objective.background"}
    assert set(base.state_dict()) <= set(sem.state_dict())
    assert not hasattr(base, "text_query") and not hasattr(base, "decoder")
    # the same seed cloud gives the same initial geometry and colours (the seeded parts)
    for k in ("means", "scales", "features_dc", "features_rest", "opacities"):
        assert torch.equal(base.gauss_params[k], sem.gauss_params[k]), k


def test_base_outputs_are_one_rh3dgs_render():
    from rh3dgs.cameras import Cameras
    from rh3dgs.rendering import render

    m = _build(SplatfactoNativeModelConfig(sh_degree=1))
    m.eval()
    cam = _camera()
    out = m.get_outputs_for_camera(cam)
    assert set(out) == {"rgb", "depth", "accumulation", "background", "depth_m1", "depth_m2"}
    cams = Cameras(viewmats=viewmat_from_c2w(cam.camera_to_worlds), Ks=cam.get_intrinsics_matrices(),
                   width=24, height=24)
    with torch.no_grad():
        ref = render(m.gaussians_for_render(), cams)
    assert float(ref.alpha.max()) > 0.5  # the camera sees the cloud
    assert torch.equal(out["rgb"], ref.rgb[0].clamp(0, 1))  # black background
    assert torch.equal(out["accumulation"][..., 0], ref.alpha[0])
    assert torch.equal(out["depth_m1"][..., 0], ref.d1[0])
    # splatfacto's strategy info, from the same projection
    assert torch.equal(m.info["radii"], ref.radii) and m.info["means2d"].shape == (1, m.num_points, 2)


def test_semantic_model_renders_the_same_rgb_plus_latents():
    base = _build(SplatfactoNativeModelConfig())
    sem = _build(Rh3dgsModelConfig(latent_dim=4))
    with torch.no_grad():
        for k, p in base.gauss_params.items():
            sem.gauss_params[k].data = p.data.clone()
    base.eval()
    sem.eval()
    a, b = base.get_outputs_for_camera(_camera()), sem.get_outputs_for_camera(_camera())
    assert torch.allclose(a["rgb"], b["rgb"], atol=1e-6) and torch.allclose(a["accumulation"], b["accumulation"])
    assert b["latents"].shape == (24, 24, 4) and b["semantics"].shape == (24, 24, 3)
    # latents composited like any feature, as the objective renders them (spherical latents: unit rows):
    # a constant latent c renders as A * c / |c|
    with torch.no_grad():
        sem.gauss_params["latents"].data[:] = torch.tensor([1.0, -2.0, 0.5, 0.0])
    c = sem.get_outputs_for_camera(_camera())
    expect = c["accumulation"] * torch.nn.functional.normalize(torch.tensor([1.0, -2.0, 0.5, 0.0]), dim=0)
    assert torch.allclose(c["latents"], expect, atol=1e-5)
