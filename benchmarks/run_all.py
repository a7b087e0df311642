"""`make bench`: every benchmark, each printing ratios against a baseline measured in the same run.

Results: benchmarks/results/<name>.json and .md, plus summary.md collecting the headline ratios.
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# bench_scale_out (K = 1 and 2 processes, ~10 min alone) runs on its own: python benchmarks/bench_scale_out.py
BENCHES = ["bench_rasterize", "bench_lift", "bench_scale", "bench_lic", "bench_query", "bench_viewer", "bench_real",
           "bench_nstrain"]


def main() -> int:
    from _common import write_results

    lines = ["# rh3dgs benchmark summary\n"]
    t0 = time.time()
    for name in BENCHES:
        if not (HERE / f"{name}.py").exists():
            continue
        print(f"=== {name}", flush=True)
        t = time.time()
        mod = importlib.import_module(name)
        mod.main()
        lines.append(f"- {name}: see results/{name.replace('bench_', '')}.md ({time.time() - t:.0f} s)")
    lines.append(f"\ntotal {time.time() - t0:.0f} s\n")
    write_results("summary", {"benches": BENCHES, "seconds": time.time() - t0}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
