"""Where rh3dgs finds the CUDA compiler (one place for setup.py, scripts/setup_system.sh cuda, benchmarks/gpu_check.sh).

A CUDA toolkit is looked for in this order; the first with a ``bin/nvcc`` wins:
  1. ``$CUDA_HOME`` (or ``$CUDA_PATH``);
  2. the toolkit of the ``nvcc`` on ``PATH`` (asked with ``nvcc --dryrun``, so that a wrapper script such
     as ``/usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc`` gives the real folder);
  3. the PyPI toolchain in this interpreter's environment: ``nvidia/cu<major>`` in site-packages, which
     ``nvidia-cuda-nvcc``, ``nvidia-nvvm`` (cicc), ``nvidia-cuda-crt``, ``nvidia-cuda-cccl`` and
     ``nvidia-cuda-runtime`` of torch's CUDA version fill (:func:`pypi_toolchain`; installed by
     ``scripts/setup_system.sh cuda`` where torch is a CUDA build and neither 1 nor 2 is there).

Standard library only (setup.py loads it before torch's build helpers read ``CUDA_HOME``).

    python scripts/cuda_toolchain.py home       # CUDA_HOME and where it came from, exit 1 if none
    python scripts/cuda_toolchain.py need       # the PyPI requirements to install, nothing if none are needed
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence, Tuple

__all__ = ["find_cuda_home", "pypi_toolchain", "torch_cuda_version", "use_cuda_home", "linkable_cudart"]

# the PyPI packages of the compiler, for CUDA >= 13 (one wheel each, all unpacked into nvidia/cu<major>)
PYPI_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime")


def _has_nvcc(home: Optional[str]) -> bool:
    return bool(home) and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK)


def _home_of_nvcc(nvcc: str) -> str:
    """The toolkit folder of an ``nvcc`` command (``_HERE_`` of its dry run is its real bin folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cu")
        open(src, "w").close()
        try:
            r = subprocess.run([nvcc, "--dryrun", "-c", src, "-o", os.path.join(tmp, "probe.o")],
                               capture_output=True, text=True, timeout=60)
            m = re.search(r"^#\$ _HERE_=(.+)$", r.stdout + r.stderr, re.M)
            if m and _has_nvcc(os.path.dirname(m.group(1).strip())):
                return os.path.dirname(m.group(1).strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def _pypi_home(paths: Sequence[str]) -> Optional[str]:
    for p in paths:
        root = os.path.join(p or ".", "nvidia")
        if not os.path.isdir(root):
            continue
        for name in sorted(os.listdir(root), reverse=True):  # cu13 before cu12
            if re.fullmatch(r"cu\d+", name) and _has_nvcc(os.path.join(root, name)):
                return os.path.join(root, name)
    return None


def find_cuda_home(paths: Optional[Sequence[str]] = None) -> Tuple[Optional[str], str]:
    """(CUDA_HOME, where it came from: "CUDA_HOME", "PATH" or "PyPI"), or (None, why none)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if _has_nvcc(home):
            return home, var
    nvcc = shutil.which("nvcc")
    if nvcc:
        return _home_of_nvcc(nvcc), "PATH"
    home = _pypi_home(sys.path if paths is None else paths)
    if home:
        return home, "PyPI"
    return None, "no nvcc: not in $CUDA_HOME, not on PATH, no PyPI toolchain (nvidia/cu*/bin/nvcc) in site-packages"


def torch_cuda_version() -> Optional[str]:
    """torch.version.cuda of this interpreter's torch ("13.0"), None for a CPU build (raises if torch is missing)."""
    import torch

    return torch.version.cuda


def pypi_toolchain(cuda_version: str) -> List[str]:
    """pip requirements of the compiler matching torch's CUDA ``major.minor`` (CUDA >= 13: nvidia/cu<major>)."""
    major = int(cuda_version.split(".")[0])
    if major < 13:
        raise RuntimeError(f"torch is built with CUDA {cuda_version}: the PyPI toolchain of CUDA < 13 is spread over "
                           "several folders; install a CUDA toolkit of that version and put its nvcc on PATH")
    return [f"{name}=={cuda_version}.*" for name in PYPI_PACKAGES]


def use_cuda_home(home: str) -> None:
    """Make ``home`` the toolkit of this process and its children (CUDA_HOME, nvcc first on PATH)."""
    os.environ["CUDA_HOME"] = home
    os.environ["PATH"] = os.path.join(home, "bin") + os.pathsep + os.environ.get("PATH", "")


def linkable_cudart(home: str) -> Optional[str]:
    """The versioned ``libcudart.so.<major>`` to link against when ``home`` has no unversioned ``libcudart.so``
    (the PyPI runtime ships only the versioned one; torch's CUDAExtension links ``-lcudart``), else None."""
    for lib in ("lib64", "lib"):
        d = os.path.join(home, lib)
        if os.path.exists(os.path.join(d, "libcudart.so")):
            return None
    for lib in ("lib64", "lib"):
        d = os.path.join(home, lib)
        if os.path.isdir(d):
            versioned = sorted(f for f in os.listdir(d) if re.fullmatch(r"libcudart\.so\.\d+", f))
            if versioned:
                return os.path.join(d, versioned[-1])
    return None


def main(argv: Sequence[str]) -> int:
    cmd = argv[0] if argv else "home"
    if cmd == "home":
        home, source = find_cuda_home()
        if home is None:
            print(source, file=sys.stderr)
            return 1
        print(f"{home}\t{source}")
        return 0
    if cmd == "need":  # what scripts/setup_system.sh cuda installs: nothing for a CPU torch or a toolkit found
        version = torch_cuda_version()
        if version is None or find_cuda_home()[0] is not None:
            return 0
        print("\n".join(pypi_toolchain(version)))
        return 0
    print(f"usage: {sys.argv[0]} home|need", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
