"""The extension as a user's ``make install`` builds it with ``RH3DGS_BUILD_CUDA=1``, on a machine without a GPU:
compile, link, the CUDA ops registered for the CUDA dispatch key, the CPU ops unchanged; and the toolchain step
(``scripts/setup_system.sh cuda``, scripts/cuda_toolchain.py) that gets nvcc from PyPI where no toolkit is found.

The whole extension is built once per state of its sources into ``build/test_cuda_build/<hash>/`` (git-ignored; the
hash covers csrc/, setup.py, the toolchain finder, torch's version and the nvcc used) with
``TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=2``: 12 compile jobs, 320 CPU-seconds on the development machine (about 3
minutes on 2 idle cores), then reused. The built library is loaded in subprocesses: the installed ``rh3dgs._C``
registers the same operator names in this process.

    python tests/test_cuda_build.py --probe [PATH/_C.so] OUT.pt    # what the tests compare (see probe())
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CUDA_OPS = {"rasterize_fwd", "rasterize_bwd", "aggregate_sphere", "lic_infonce_fwd", "lic_infonce_bwd"}
"""The ops with a CUDA kernel (csrc/cuda/*.cu); the test also reads them from the sources' ``m.impl`` lines."""


def _toolchain():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import cuda_toolchain
    finally:
        sys.path.remove(str(SCRIPTS))
    return cuda_toolchain


def _cuda_ops_in_sources() -> set:
    ops = set()
    for src in (ROOT / "csrc" / "cuda").glob("*.cu"):
        ops |= set(re.findall(r'm\.impl\("(\w+)"', src.read_text()))
    return ops


def _build_key(cuda_home: str) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in (ROOT / "csrc").rglob("*") if p.is_file()) + [ROOT / "setup.py",
                                                                           SCRIPTS / "cuda_toolchain.py"]
    for p in files:
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    nvcc = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True).stdout
    h.update(f"{torch.__version__}|{sys.version}|{cuda_home}|{nvcc}".encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def cuda_build():
    """Path of the ``_C`` library built with RH3DGS_BUILD_CUDA=1 (cached under build/test_cuda_build/)."""
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: it has no CUDA kernels to build against")
    home, source = _toolchain().find_cuda_home()
    if home is None:
        why = f"{source}: `PYTHON={sys.executable} scripts/setup_system.sh cuda` installs the PyPI toolchain"
        if os.environ.get("CI"):
            pytest.fail(why)  # CI's `make install` installs it: the build must run there
        pytest.skip(why)
    cache = ROOT / "build" / "test_cuda_build"
    out = cache / _build_key(home)
    lib = next(out.glob("lib/rh3dgs/_C*.so"), None)
    if lib is not None:
        return lib
    tmp = cache / f"{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ, RH3DGS_BUILD_CUDA="1", TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp / "lib"), "--build-temp",
                        str(tmp / "obj")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"RH3DGS_BUILD_CUDA=1 build failed (toolkit {home}, from {source}):\n{r.stderr[-6000:]}"
    shutil.rmtree(tmp / "obj")  # the objects (~30 MB) are not needed again
    for old in cache.iterdir():  # one cached build: the current one
        if old != tmp and not old.name.endswith(f".tmp{os.getpid()}"):
            shutil.rmtree(old, ignore_errors=True)
    tmp.rename(out)
    return next(out.glob("lib/rh3dgs/_C*.so"))


def _probe(tmp_path: Path, so=None) -> dict:
    out = tmp_path / ("probe-built.pt" if so else "probe-installed.pt")
    cmd = [sys.executable, __file__, "--probe"] + ([str(so)] if so else []) + [str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
    assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(out)


@pytest.mark.slow
def test_cuda_build_registers_every_cuda_op(cuda_build, tmp_path):
    """Every op with a kernel in csrc/cuda has it registered for the CUDA dispatch key (and rh3dgs's dispatcher,
    ``has_native_kernel``, sees it), and every CUDA op has its CPU kernel too."""
    assert _cuda_ops_in_sources() == CUDA_OPS
    built = _probe(tmp_path, cuda_build)
    assert set(built["cuda_ops"]) == CUDA_OPS, built["cuda_ops"]
    assert set(built["has_native_cuda"]) == CUDA_OPS
    assert CUDA_OPS <= set(built["cpu_ops"])


@pytest.mark.slow
def test_cuda_build_keeps_the_cpu_ops(cuda_build, tmp_path):
    """The CUDA build's CPU ops are the installed extension's: the same ops and schemas, and the same results on small
    inputs of every CPU op (values and gradients; bit for bit)."""
    built, installed = _probe(tmp_path, cuda_build), _probe(tmp_path)
    assert built["cpu_ops"] == installed["cpu_ops"]
    assert built["schemas"] == installed["schemas"]
    assert not installed["cuda_ops"] or torch.cuda.is_available()  # the installed one: CPU kernels on a CPU machine
    assert built["results"].keys() == installed["results"].keys()
    for name, a in built["results"].items():
        b = installed["results"][name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), (name, float((a.double() - b.double()).abs().max()))
    assert len(built["results"]) >= 30


def probe(so, out) -> None:
    """With ``so`` (a built _C library) loaded as ``rh3dgs._C`` (else the installed one): the rh3dgs ops registered
    for CPU and CUDA, their schemas, and every CPU op's outputs on small inputs (values and gradients) -> ``out``."""
    import importlib.util

    import rh3dgs

    if so is not None:
        spec = importlib.util.spec_from_file_location("rh3dgs._C", so)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["rh3dgs._C"] = mod
        spec.loader.exec_module(mod)
        rh3dgs._C = mod
    from rh3dgs import ops
    from rh3dgs.ops._backend import has_native_kernel, native_ops

    native_ops()
    torch.set_num_threads(2)
    names = lambda key: sorted(r.split("::")[1] for r in torch._C._dispatch_get_registrations_for_dispatch_key(key)  # noqa: E731
                               if r.startswith("rh3dgs::"))
    cpu_ops = names("CPU")
    res = {}
    g = torch.Generator().manual_seed(0)
    sys.path.insert(0, str(ROOT / "tests"))
    from _scenes import random_projected

    s = random_projected(2, 60, 19, 40, 33, seed=1)
    ins = [s[k].clone().requires_grad_(True) for k in ("means2d", "conics", "features", "opacities", "depths")]
    bg = torch.rand(2, 19, generator=g)
    for cg in (None, 3):
        o = ops.rasterize_to_pixels(*ins, 40, 33, 16, s["isect_offsets"], s["flatten_ids"], backgrounds=bg,
                                    geometry_channels=cg)
        (o.render.square().sum() + o.alpha.sum() + o.d1.sum() + 0.1 * o.d2.sum()).backward()
        for k, t in zip(("render", "alpha", "d1", "d2"), (o.render, o.alpha, o.d1, o.d2)):
            res[f"rasterize.{cg}.{k}"] = t.detach()
        for i, t in enumerate(ins):
            res[f"rasterize.{cg}.grad{i}"] = t.grad
            t.grad = None
    rec = ops.rasterize_to_pixels(*(t.detach() for t in ins), 40, 33, 16, s["isect_offsets"], s["flatten_ids"],
                                  record=True).contributions
    for k in ("seg_offsets", "pair_offsets", "segments", "lanes", "weights", "masses"):
        res[f"record.{k}"] = getattr(rec, k)
    feats = torch.nn.functional.normalize(torch.randn(2, 33, 40, 8, generator=g), dim=-1)
    w, mu = torch.rand(2, 33, 40, generator=g), torch.nn.functional.normalize(torch.randn(60, 8, generator=g), dim=-1)
    for mode in ("init", "irls"):
        trav = ops.aggregate_sphere(s["means2d"], s["conics"], s["opacities"], feats, w, s["isect_offsets"],
                                    s["flatten_ids"], 16, mu=mu, delta=0.3, mode=mode)
        rep = ops.aggregate_sphere_replay(rec, feats, w, mu, 0.3, mode)
        for i in range(3):
            res[f"aggregate.{mode}.{i}"], res[f"replay.{mode}.{i}"] = trav[i], rep[i]
    from rh3dgs import Cameras

    n = 500
    means, quats = torch.randn(n, 3, generator=g), torch.randn(n, 4, generator=g)
    scales = 0.05 * torch.rand(n, 3, generator=g) + 0.01
    cams = Cameras.look_at(torch.tensor([[3.0, 0.5, 1.0], [-2.0, 2.0, 0.5]]), torch.zeros(3), width=48, height=40)
    leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales)]
    radii, m2d, dep, con = ops.project_gaussians(*leaves, cams.viewmats, cams.Ks, 48, 40)
    (m2d.sum() + dep.sum() + con.square().sum()).backward()
    res.update({"project.radii": radii, "project.means2d": m2d.detach(), "project.depths": dep.detach(),
                "project.conics": con.detach()})
    res.update({f"project.grad{i}": t.grad for i, t in enumerate(leaves)})
    coeffs = torch.randn(n, 16, 3, generator=g)
    res["sh"] = ops.sh_colors(3, means, torch.tensor([[3.0, 0.5, 1.0]]), coeffs)
    bins = ops.isect_tiles(m2d.detach(), radii, dep.detach(), 16, 3, 3)
    res.update({f"isect_tiles.{i}": t for i, t in enumerate(bins)})
    lat = torch.randn(300, 16, generator=g)
    res["relevancy"] = ops.relevancy(lat, torch.randn(2, 16, generator=g), torch.randn(4, 16, generator=g),
                                     torch.eye(16), 10.0)
    res["guided"] = ops.guided_upsample(torch.randn(5, 6, 8, generator=g), torch.rand(20, 24, 3, generator=g))
    anchors, cand = torch.randint(300, (40,), generator=g), torch.randint(300, (40, 12), generator=g)
    kinds = torch.randint(0, 3, (40, 12), generator=g, dtype=torch.uint8)
    for form, fn in (("infonce", lambda x: ops.lic_infonce(x, anchors, cand, kinds, 0.1)),
                     ("pull", lambda x: ops.lic_pull(x, anchors, cand, kinds))):
        x = lat.clone().requires_grad_(True)
        loss = fn(x)
        loss.sum().backward()
        res[f"lic.{form}"], res[f"lic.{form}.grad"] = loss.detach(), x.grad
    torch.save({"cpu_ops": cpu_ops, "cuda_ops": names("CUDA"),
                "has_native_cuda": [op for op in cpu_ops if has_native_kernel(op, torch.device("cuda"))],
                "schemas": {op: [str(sc) for sc in torch._C._jit_get_schemas_for_operator(f"rh3dgs::{op}")]
                            for op in cpu_ops},
                "results": {k: v.detach().contiguous() for k, v in res.items()}}, out)


# ---------------------------------------------------------------------------------------- the toolchain step
def _fake_toolkit(root: Path, nvcc_body: str = "") -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\n{nvcc_body}\n")
    nvcc.chmod(0o755)
    return root


def test_toolkit_is_found_in_cuda_home_then_path_then_pypi(tmp_path, monkeypatch):
    """$CUDA_HOME first; then the nvcc on PATH, resolved through its dry run's _HERE_ (a wrapper script in another
    folder, as /usr/local/bin/nvcc execs /usr/local/cuda-13.0/bin/nvcc); then nvidia/cu<major> in site-packages."""
    tc = _toolchain()
    real = _fake_toolkit(tmp_path / "cuda-13.0")
    wrappers = tmp_path / "wrappers"
    _fake_toolkit(wrappers, f'echo "#$ _HERE_={real}/bin" >&2')  # answers nvcc --dryrun as the real one does
    pypi = _fake_toolkit(tmp_path / "site" / "nvidia" / "cu13")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(real))
    assert tc.find_cuda_home([]) == (str(real), "CUDA_HOME")
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("PATH", f"{wrappers / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert tc.find_cuda_home([]) == (str(real), "PATH")
    monkeypatch.setenv("PATH", f"/usr/bin{os.pathsep}/bin")
    if shutil.which("nvcc") is None:
        assert tc.find_cuda_home([str(tmp_path / "elsewhere"), str(tmp_path / "site")]) == (str(pypi), "PyPI")
        home, why = tc.find_cuda_home([str(tmp_path / "elsewhere")])
        assert home is None and "no nvcc" in why
    # the PyPI runtime ships libcudart.so.13 only: the build links it through a libcudart.so link
    (pypi / "lib").mkdir()
    (pypi / "lib" / "libcudart.so.13").write_bytes(b"")
    assert tc.linkable_cudart(str(pypi)) == str(pypi / "lib" / "libcudart.so.13")
    (pypi / "lib" / "libcudart.so").symlink_to("libcudart.so.13")
    assert tc.linkable_cudart(str(pypi)) is None
    assert tc.pypi_toolchain("13.0") == [f"{p}==13.0.*" for p in tc.PYPI_PACKAGES]
    with pytest.raises(RuntimeError, match="CUDA 12.8"):
        tc.pypi_toolchain("12.8")


def _setup_cuda(tmp_path, python_body: str, *args, env=None):
    """scripts/setup_system.sh [args] cuda with a stand-in interpreter (its answer to ``cuda_toolchain.py need`` is
    python_body's output) and PATH without nvcc."""
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho \"python $*\" >> {tmp_path / 'log'}\n{python_body}\n")
    py.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "RH3DGS_BUILD_CUDA")}
    e.update(PYTHON=str(py), PATH=f"/usr/bin{os.pathsep}/bin", **(env or {}))
    r = subprocess.run(["bash", str(SCRIPTS / "setup_system.sh"), *args, "cuda"], capture_output=True, text=True,
                       env=e, timeout=60, cwd=ROOT)
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    return r, log


def test_setup_system_cuda_step_fetches_the_pypi_toolchain_only_when_needed(tmp_path):
    need = 'case "$*" in *cuda_toolchain.py\\ need*) printf "nvidia-cuda-nvcc==13.0.*\\nnvidia-nvvm==13.0.*\\n";; esac'
    r, log = _setup_cuda(tmp_path, need, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "will fetch the PyPI toolchain" in r.stderr
    assert "-m pip install -q nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.*" in r.stderr
    assert not any("pip install" in line for line in log)  # a dry run installs nothing
    r, log = _setup_cuda(tmp_path, need)
    assert r.returncode == 0 and any("-m pip install" in line and "nvidia-nvvm==13.0.*" in line for line in log)
    # nothing needed (a CPU torch, or a toolkit found): silent, nothing installed; RH3DGS_BUILD_CUDA=0: not even asked
    (tmp_path / "log").unlink()
    r, log = _setup_cuda(tmp_path, "true")
    assert r.returncode == 0 and r.stderr == "" and not any("pip install" in line for line in log)
    (tmp_path / "log").unlink()
    r, log = _setup_cuda(tmp_path, need, env={"RH3DGS_BUILD_CUDA": "0"})
    assert r.returncode == 0 and log == []
    # a failing answer (no torch in that interpreter) is named, exit 1
    r, _ = _setup_cuda(tmp_path, 'echo "ModuleNotFoundError: No module named torch" >&2; exit 1')
    assert r.returncode == 1 and "No module named torch" in r.stderr


def test_cuda_toolchain_need_with_this_interpreter(tmp_path):
    """The finder in this interpreter: with $CUDA_HOME at a toolkit nothing is needed; with PATH without nvcc, either
    the PyPI toolchain beside torch is found (nothing needed) or, torch being a CUDA build, its version's is."""
    def run(cmd, env):
        r = subprocess.run([sys.executable, str(SCRIPTS / "cuda_toolchain.py"), cmd], capture_output=True, text=True,
                           env=env, timeout=120)
        return r.returncode, r.stdout

    assert run("need", dict(os.environ, CUDA_HOME=str(_fake_toolkit(tmp_path / "cuda")))) == (0, "")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = f"/usr/bin{os.pathsep}/bin"
    code, home = run("home", env)
    code_need, need = run("need", env)
    assert code_need == 0
    if code == 0:
        assert home.rstrip().endswith("\tPyPI") and need == ""
    else:
        assert need.split() == ([] if torch.version.cuda is None else _toolchain().pypi_toolchain(torch.version.cuda))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--probe":
        probe(sys.argv[2] if len(sys.argv) == 4 else None, sys.argv[-1])
    else:
        sys.exit(__doc__)
