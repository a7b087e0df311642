"""Evaluation: segmentation metrics (:mod:`.metrics`) and benchmark protocols (:mod:`.protocols`)."""
from __future__ import annotations

from . import metrics, protocols
from .metrics import *  # noqa: F401,F403  every metric
from .protocols import *  # noqa: F401,F403  every benchmark protocol

__all__ = [*metrics.__all__, *protocols.__all__]
