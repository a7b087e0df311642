"""Peak memory of a block of work (CUDA allocator peak on a GPU, sampled RSS growth on CPU)."""
from __future__ import annotations

import os
import threading
from typing import Optional, Union

import torch

__all__ = ["PeakMemory"]


class PeakMemory:
    """Peak memory of a block: CUDA ``max_memory_allocated`` on a GPU, else peak RSS growth.

    On CPU a thread samples the process's resident set size (``/proc/self/statm``) every
    ``interval`` seconds; ``peak_bytes`` is the largest RSS seen minus the RSS at entry
    (0 where ``/proc`` is unavailable). Sampling can miss allocations shorter than the interval.
    """

    def __init__(self, device: Union[str, torch.device] = "cpu", interval: float = 0.005):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _rss(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._rss()
        self._max = self._base

        def loop():
            while not self._stop.wait(self.interval):
                self._max = max(self._max, self._rss())

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device) - self._base)
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._max = max(self._max, self._rss())
        self.peak_bytes = int(max(0, self._max - self._base))
