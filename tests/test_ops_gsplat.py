"""The gsplat shim (rh3dgs/ops/_gsplat.py) pinned against gsplat 1.4.0: names, parameters, numbers.

If gsplat is upgraded, this file says what changed under the shim; fix the shim (one file) and this.
"""
from __future__ import annotations

import importlib
import inspect
import math
import subprocess
import sys

import pytest
import torch

gsplat = pytest.importorskip("gsplat")

from rh3dgs.ops import _gsplat as gs  # noqa: E402
from rh3dgs.ops import isect_tiles  # noqa: E402

C0 = 0.28209479177387814
C1 = 0.4886025119029199


def test_pinned_version():
    assert gsplat.__version__ == gs.GSPLAT_VERSION


@pytest.mark.parametrize("where", sorted(gs.EXPECTED), ids=lambda w: f"{w[0]}.{w[1]}")
def test_expected_functions_and_parameters(where):
    module, name = where
    fn = getattr(importlib.import_module(module), name, None)
    assert callable(fn), f"{module}.{name} is gone"
    params = list(inspect.signature(fn).parameters)
    expected = list(gs.EXPECTED[where])
    assert params[:len(expected)] == expected, f"{module}.{name}{inspect.signature(fn)}"


def test_every_gsplat_import_goes_through_the_shim():
    """No rh3dgs module but the shim names gsplat's private functions (a gsplat upgrade touches one file)."""
    from pathlib import Path

    root = Path(gs.__file__).resolve().parents[1]
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "_gsplat.py" and "gsplat.cuda" in p.read_text(encoding="utf-8")]
    assert not offenders, offenders


def test_importing_the_shim_imports_no_gsplat():
    code = "import sys\nimport rh3dgs.ops._gsplat\nassert 'gsplat' not in sys.modules, 'gsplat imported'\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def _rotmat(q: torch.Tensor) -> torch.Tensor:
    """(w, x, y, z) -> R, the textbook formula for a unit quaternion."""
    w, x, y, z = torch.nn.functional.normalize(q, dim=-1).unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)


def test_quat_scale_to_covar():
    g = torch.Generator().manual_seed(0)
    q, s = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.rand(5, 3, generator=g, dtype=torch.float64)
    R = _rotmat(q)
    ref = R @ torch.diag_embed(s * s) @ R.transpose(1, 2)
    torch.testing.assert_close(gs.quat_scale_to_covar(q, s), ref)


def test_fully_fused_projection_torch_one_gaussian():
    """A Gaussian at camera-space (x, y, z): means2d = K (x/z, y/z), depth z, conic = inv(J S J^T + eps I)."""
    fx, fy, cx, cy, W, H = 50.0, 40.0, 32.0, 24.0, 64, 48
    K = torch.tensor([[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]], dtype=torch.float64)
    view = torch.eye(4, dtype=torch.float64)[None]
    view[0, :3, 3] = torch.tensor([0.1, -0.2, 0.5])  # world -> camera translation
    mean = torch.tensor([[0.2, 0.1, 2.0]], dtype=torch.float64)
    cov = torch.tensor([[[0.02, 0.005, 0.0], [0.005, 0.01, 0.002], [0.0, 0.002, 0.03]]], dtype=torch.float64)
    radii, m2d, depth, conic = gs.fully_fused_projection_torch(mean, cov, view, K, W, H, 0.3, 0.01, 1e10)
    x, y, z = (mean[0] + view[0, :3, 3]).tolist()
    torch.testing.assert_close(m2d[0, 0], torch.tensor([cx + fx * x / z, cy + fy * y / z], dtype=torch.float64))
    assert math.isclose(float(depth[0, 0]), z)
    J = torch.tensor([[fx / z, 0, -fx * x / z ** 2], [0, fy / z, -fy * y / z ** 2]], dtype=torch.float64)
    cov2 = J @ cov[0] @ J.T + 0.3 * torch.eye(2, dtype=torch.float64)
    inv = torch.linalg.inv(cov2)
    torch.testing.assert_close(conic[0, 0], torch.stack([inv[0, 0], inv[0, 1], inv[1, 1]]))
    lam = torch.linalg.eigvalsh(cov2).max()
    assert int(radii[0, 0]) == math.ceil(3 * math.sqrt(float(lam)))
    # behind the near plane: culled
    radii, *_ = gs.fully_fused_projection_torch(-mean - 2 * view[0, :3, 3], cov, view, K, W, H, 0.3, 0.01, 1e10)
    assert int(radii[0, 0]) == 0


def test_spherical_harmonics_torch_degrees_0_and_1():
    """gsplat's real SH basis: Y0 = C0, (Y1, Y2, Y3) = C1 (-y, z, -x) at the normalised direction."""
    g = torch.Generator().manual_seed(1)
    d = torch.randn(7, 3, generator=g, dtype=torch.float64) * 3
    c = torch.randn(7, 4, 3, generator=g, dtype=torch.float64)
    x, y, z = torch.nn.functional.normalize(d, dim=-1).unbind(-1)
    basis = torch.stack([torch.full_like(x, C0), -C1 * y, C1 * z, -C1 * x], -1)
    torch.testing.assert_close(gs.eval_sh_bases(4, torch.nn.functional.normalize(d, dim=-1)), basis)
    torch.testing.assert_close(gs.spherical_harmonics_torch(1, d, c), (basis[..., None] * c).sum(-2))
    torch.testing.assert_close(gs.spherical_harmonics_torch(0, d, c[:, :1]), C0 * c[:, 0])


def test_isect_tiles_torch_matches_native_binning():
    """In a 4x3 grid of 16-pixel tiles, Gaussian 0 covers tiles 1, 2, 5, 6, Gaussian 1 is culled and the
    nearer Gaussian 2 covers tile 6: the same intersections (tile-major, then depth order) and offsets as
    rh3dgs's native binning."""
    means2d = torch.tensor([[[30.0, 14.0], [5.0, 5.0], [40.0, 20.0]]])
    radii = torch.tensor([[6, 0, 3]], dtype=torch.int32)
    depths = torch.tensor([[2.0, 1.0, 1.5]])
    tpg, ids, fids = gs.isect_tiles_torch(means2d, radii, depths, 16, 4, 3)
    assert tpg.tolist() == [[4, 0, 1]]
    offsets = gs.isect_offset_encode_torch(ids, 1, 4, 3)
    n_tpg, n_offsets, n_fids = isect_tiles(means2d, radii, depths, 16, 4, 3)
    assert torch.equal(n_tpg.int(), tpg.int())
    assert torch.equal(n_offsets.int(), offsets.int())
    assert torch.equal(n_fids.int(), fids.int())
    assert fids.tolist() == [0, 0, 0, 2, 0]  # tiles 1, 2, 5, then 6: Gaussian 2 (depth 1.5) before 0 (2.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat's CUDA kernels need a GPU")
def test_cuda_wrappers_match_the_torch_ones():  # pragma: no cover - CPU machines skip
    g = torch.Generator().manual_seed(2)
    n = 200
    means = torch.randn(n, 3, generator=g) * 0.5 + torch.tensor([0.0, 0.0, 3.0])
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.05 + 0.01
    view = torch.eye(4)[None]
    K = torch.tensor([[[60.0, 0, 32], [0, 60.0, 24], [0, 0, 1]]])
    ref = gs.fully_fused_projection_torch(means, gs.quat_scale_to_covar(quats, scales), view, K, 64, 48, 0.3, 0.01, 1e10)
    got = gs.fully_fused_projection_cuda(*(t.cuda() for t in (means, quats, scales, view, K)), 64, 48, 0.3, 0.01, 1e10)
    vis = ref[0] > 0
    assert torch.equal(got[0].cpu() > 0, vis)
    for a, b in zip(got[1:], ref[1:]):
        torch.testing.assert_close(a.cpu()[vis], b[vis], atol=1e-3, rtol=1e-4)
    dirs, coeffs = torch.randn(n, 3, generator=g), torch.randn(n, 16, 3, generator=g)
    torch.testing.assert_close(gs.spherical_harmonics_cuda(3, dirs.cuda(), coeffs.cuda()).cpu(),
                               gs.spherical_harmonics_torch(3, dirs, coeffs), atol=1e-5, rtol=1e-5)


# A CPU run in which importing gsplat's CUDA backend (which JIT-builds gsplat's extension when nvcc is on PATH) or any
# torch JIT build raises; it renders (RGB + features, backward), lifts, trains rh3dgs-lite through nerfstudio's own
# train entry (its densification included), evaluates, and checks the guard is live.
_NO_BUILD_SCRIPT = r'''
import importlib.abc, sys, traceback
from pathlib import Path

class NoGsplatBuild(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gsplat.cuda._backend":
            raise RuntimeError("gsplat's CUDA backend imported on a CPU path:\n" + "".join(traceback.format_stack()))
        return None

sys.meta_path.insert(0, NoGsplatBuild())
import torch.utils.cpp_extension as cpp

def no_jit(*a, **k):
    raise RuntimeError("a torch JIT build started on a CPU path:\n" + "".join(traceback.format_stack()))

cpp.load = cpp.load_inline = cpp._jit_compile = no_jit

import torch
work = Path(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from _scenes import random_lift_scene
from rh3dgs import render
from rh3dgs.lifting import LiftConfig, lift

gs, cams, maps = random_lift_scene(300, 3, 32, 8, seed=0)
gs.means.requires_grad_(True)
f = torch.randn(len(gs), 4, requires_grad=True)
r = render(gs, cams, f)
(r.rgb.sum() + r.features.sum()).backward()
assert gs.means.grad.abs().sum() > 0
res = lift(gs.to("cpu"), cams, maps, LiftConfig(latent_dim=4), progress=False)
assert res.valid.any()

from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
from rh3dgs.data.teacher_sim import simulate_teacher
from rh3dgs.nerfstudio.config import rh3dgs_lite_config
from nerfstudio.scripts.train import main as ns_train

write_dataset(make_scene(SceneConfig(num_views=8, image_size=32, gaussians_per_unit_area=800.0)), work / "data",
              progress=False)
simulate_teacher(work / "data", progress=False)
c = rh3dgs_lite_config()
c.pipeline.datamanager.data = work / "data"
c.pipeline.datamanager.teacher_cache_dir = work / "cache"
c.output_dir, c.vis, c.machine.device_type = work / "out", "tensorboard", "cpu"
c.max_num_iterations = c.steps_per_save = 6
c.viewer.quit_on_train_completion = True
m = c.pipeline.model
m.warmup_length, m.refine_every, m.max_init_points = 2, 2, 1500  # densification inside the 6 steps
ns_train(c)
try:
    import gsplat.cuda._backend  # noqa: F401
except RuntimeError as exc:
    assert "CPU path" in str(exc)
else:
    raise AssertionError("the guard did not stop an import of gsplat's CUDA backend")
print("NO GSPLAT BUILD")
'''


@pytest.mark.slow
def test_cpu_paths_start_no_gsplat_build(tmp_path):
    """Render, lift and ``rh3dgs-lite`` training (nerfstudio's train entry: forward, losses, backward, the optimizers,
    densification) on CPU import neither gsplat's CUDA backend, whose import JIT-builds gsplat's kernels where nvcc is
    found (and cannot work for CPU tensors), nor start any torch JIT build."""
    import os
    from pathlib import Path

    pytest.importorskip("nerfstudio")
    tests = Path(__file__).resolve().parent
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _NO_BUILD_SCRIPT, str(tmp_path), str(tests)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "NO GSPLAT BUILD" in r.stdout, (r.stdout[-2000:], r.stderr[-6000:])
