"""Shared helpers of the benchmark scripts: scenes, timing, peak memory, result files."""
from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def random_scene(n: int, seed: int = 0, extent: float = 1.0, scale: float = 0.02):
    """N random Gaussians in a cube of half-size ``extent`` (sizes log-normal around ``scale``)."""
    from rh3dgs import Gaussians

    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) - 0.5) * 2 * extent
    scales = scale * torch.exp(0.3 * torch.randn(n, 3, generator=g))
    return Gaussians.from_activated(means, scales, torch.randn(n, 4, generator=g), 0.1 + 0.8 * torch.rand(n, generator=g),
                                    torch.rand(n, 3, generator=g))


def orbit(num: int, size: int, radius: float = 3.5, height: float = 1.0):
    import math

    from rh3dgs import Cameras

    eyes = torch.tensor([[radius * math.cos(2 * math.pi * i / num), radius * math.sin(2 * math.pi * i / num), height]
                         for i in range(num)])
    return Cameras.look_at(eyes, torch.zeros(3), width=size, height=size)


def timeit(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> Dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_isolated(script: str, args: List[str]) -> Dict:
    """Run ``script args`` in a fresh interpreter (so peak RSS is its own) and parse its JSON line."""
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def entry(measure: Callable[[str], Dict], main: Callable[[], object]) -> None:
    """A benchmark script's ``__main__``: ``--only PART`` prints ``measure(PART)`` as one JSON line
    (the child of :func:`run_isolated`); otherwise ``main()``."""
    if len(sys.argv) == 3 and sys.argv[1] == "--only":
        print(json.dumps(measure(sys.argv[2])))
    else:
        main()


def machine() -> Dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": str(torch.get_num_threads()),
            "cpu_count": str(os.cpu_count()), "cuda": str(torch.cuda.is_available())}


def write_results(name: str, payload: Dict, markdown: str) -> Dict:
    """Write results/<name>.json and .md (atomically), print the Markdown; returns ``payload``."""
    from rh3dgs.io.atomic import atomic_save_json, atomic_save_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_save_json(RESULTS / f"{name}.json", payload)
    atomic_save_text(RESULTS / f"{name}.md", markdown)
    print(markdown)
    return payload
