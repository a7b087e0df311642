import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/_scenes.py helpers
os.environ.setdefault("RH3DGS_QUIET", "1")


def _no_gpu_reason() -> str:
    if torch.version.cuda is None:
        return f"no CUDA GPU: torch {torch.__version__} is a CPU build (the CUDA cases run on a GPU machine: " \
               "benchmarks/gpu_check.sh)"
    return "no CUDA GPU visible (torch.cuda.is_available() is False; the CUDA cases run on a GPU machine: " \
           "benchmarks/gpu_check.sh)"


# The devices every device-parametrised test runs on: CPU always, CUDA where a GPU is visible (else skipped
# with the reason). A test takes the ``device`` fixture and compares the op on that device with the same
# ``_ref`` reference (computed on CPU) the CPU kernel is held to.
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason=_no_gpu_reason()))]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """torch.device of each device present (see DEVICES)."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
