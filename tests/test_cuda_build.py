"""Compile-only check of the CUDA sources, so a broken .cu is caught on machines without a GPU."""
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None or torch.version.cuda is None, reason="needs nvcc and a CUDA build of torch")
@pytest.mark.parametrize("source", sorted(p.name for p in (ROOT / "csrc" / "cuda").glob("*.cu")))
def test_cuda_source_compiles(source, tmp_path):
    from torch.utils.cpp_extension import include_paths

    cmd = ["nvcc", "-c", str(ROOT / "csrc" / "cuda" / source), "-o", str(tmp_path / (source + ".o")), "-std=c++20",
           "-O1", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
           f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=_C"]
    cmd += [f"-I{p}" for p in include_paths("cuda")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / (source + ".o")).stat().st_size > 10_000
