"""Importing rh3dgs is silent and never compiles; rendering on CPU never touches gsplat's CUDA JIT."""
import subprocess
import sys


def _run(code: str):
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)


def test_import_is_silent_and_loads_nothing_heavy():
    code = (
        "import sys\n"
        "import rh3dgs\n"
        "heavy = [m for m in ('gsplat', 'open_clip', 'nerfstudio', 'rh3dgs._C', 'torch.utils.cpp_extension')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = _run(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""


def test_cpu_render_never_loads_gsplat_cuda_backend():
    # Importing gsplat.cuda._backend starts gsplat's JIT build: the CPU path must never import it.
    code = (
        "import sys, torch\n"
        "import rh3dgs\n"
        "from rh3dgs.data.synthetic import SceneConfig, make_scene\n"
        "s = make_scene(SceneConfig(gaussians_per_unit_area=500, num_views=2, image_size=32))\n"
        "r = rh3dgs.render(s.gaussians, s.cameras, torch.ones(len(s.gaussians), 2))\n"
        "assert r.alpha.max() > 0.5\n"
        "assert 'gsplat.cuda._backend' not in sys.modules\n"
        "assert 'gsplat.cuda._torch_impl' in sys.modules\n"
    )
    p = _run(code)
    assert p.returncode == 0, p.stderr[-3000:]
