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
        # projection, SH and binning are rh3dgs' native CPU ops now: gsplat's CUDA side is not even imported
        "assert 'gsplat.cuda._wrapper' not in sys.modules\n"
    )
    p = _run(code)
    assert p.returncode == 0, p.stderr[-3000:]


def test_no_public_function_is_shadowed_by_a_submodule():
    """Importing any submodule (as `from rh3dgs.x import y` does) leaves rh3dgs.render / lift / load callable."""
    code = (
        "import importlib, pkgutil, rh3dgs\n"
        "skip = ('rh3dgs.nerfstudio', 'rh3dgs.viewer', 'rh3dgs.distributed')\n"
        "for m in pkgutil.walk_packages(rh3dgs.__path__, 'rh3dgs.'):\n"
        "    if not m.name.startswith(skip) and m.name != 'rh3dgs._C':\n"
        "        importlib.import_module(m.name)\n"
        "from rh3dgs.rendering import render as r1\n"
        "from rh3dgs.lifting import lift as l1\n"
        "names = [n for n in ('render', 'lift', 'load') if not callable(getattr(rh3dgs, n))]\n"
        "assert not names, names\n"
        "assert rh3dgs.render is r1 and rh3dgs.lift is l1\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
