import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/_scenes.py helpers
os.environ.setdefault("RH3DGS_QUIET", "1")



@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
