"""Shared helpers of the benchmark scripts: scenes, timing, peak memory, result files."""
from __future__ import annotations

import functools
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
    times, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats,
            "cpu_median_s": statistics.median(cpu)}


def interleaved(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, Dict[str, List[float]]]:
    """Wall and CPU seconds of each function per round, timed in turn every round (after one warm-up
    call each), so that load from other processes hits them alike; compare them by per-round ratios.
    Returns {"wall": {name: [s, ...]}, "cpu": {name: [s, ...]}} (CPU: this process, all threads)."""
    for fn in fns.values():
        fn()
    out: Dict[str, Dict[str, List[float]]] = {"wall": {n: [] for n in fns}, "cpu": {n: [] for n in fns}}
    for _ in range(rounds):
        for name, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            out["wall"][name].append(time.perf_counter() - t)
            out["cpu"][name].append(time.process_time() - c)
    return out


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux carries that over ``exec`` from the
    parent's address space when ``subprocess`` vforks, so a child of a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) / 1024.0
    except (OSError, StopIteration):
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
    cpu = cpu_peak_fma()
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": str(torch.get_num_threads()),
            "cpu_count": str(os.cpu_count()), "cuda": str(torch.cuda.is_available()), "cpu_model": str(cpu["model"]),
            "microarchitecture": str(cpu["microarchitecture"]), "commit": code_commit()}


@functools.lru_cache(maxsize=None)
def code_commit() -> str:
    """The commit of the code measured (``git rev-parse --short HEAD``), "+changes" when the package, the native
    sources or the benchmarks differ from it; "unknown" outside a git checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "rh3dgs", "csrc", "setup.py",
                                  "benchmarks/*.py"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+changes" if changed else "")) if head else "unknown"


def machine_line(m: Dict[str, str]) -> str:
    """The line every result file ends with, from :func:`machine`'s ``m``: the CPU (model, vector datapath), CPUs,
    torch threads and commit."""
    return (f"Machine: {m['cpu_model']} ({m['microarchitecture']}), {m['cpu_count']} CPUs, {m['threads']} torch "
            f"threads, CUDA {m['cuda']}; code {m['commit']}.")


def write_results(name: str, payload: Dict, markdown: str) -> Dict:
    """Write results/<name>.json and .md (atomically), each naming the machine and commit (:func:`machine_line`),
    print the Markdown; returns ``payload`` with its "machine"."""
    from rh3dgs.io.atomic import atomic_save_json, atomic_save_text

    RESULTS.mkdir(parents=True, exist_ok=True)
    m = machine()
    payload = {**payload, "machine": {**m, **payload.get("machine", {})}}
    markdown = markdown.rstrip("\n") + "\n\n" + machine_line(m) + "\n"
    atomic_save_json(RESULTS / f"{name}.json", payload)
    atomic_save_text(RESULTS / f"{name}.md", markdown)
    print(markdown)
    return payload


#: Single-precision FMA lanes per cycle per core, by vector datapath (not by ISA: Zen 4 runs an AVX-512 FMA through
#: its two 256-bit pipes, one 512-bit FMA per cycle, so its peak is its AVX2 peak). The first row that matches
#: (vendor, CPU family, lscpu flags) is this machine's; ``make bench`` prints the table with it marked.
FMA_PEAKS = (
    ("AMD Zen 5 (family 1Ah), AVX-512", lambda v, fam, fl: v == "AuthenticAMD" and fam >= 0x1A and "avx512f" in fl,
     32, "two 512-bit FMA pipes (server / desktop parts)"),
    ("AMD Zen 4 (family 19h with AVX-512)", lambda v, fam, fl: v == "AuthenticAMD" and "avx512f" in fl,
     16, "two 256-bit FMA pipes; a 512-bit FMA takes both"),
    ("AMD Zen 2 / Zen 3, AVX2", lambda v, fam, fl: v == "AuthenticAMD" and {"avx2", "fma"} <= fl,
     16, "two 256-bit FMA pipes"),
    ("Intel Xeon Skylake-SP and later, AVX-512", lambda v, fam, fl: v == "GenuineIntel" and "avx512f" in fl,
     32, "two 512-bit FMA units (Gold / Platinum; some Silver / Bronze parts have one: half)"),
    ("x86 with AVX2 + FMA (Intel Haswell and later)", lambda v, fam, fl: {"avx2", "fma"} <= fl,
     16, "two 256-bit FMA units"),
    ("other (SSE)", lambda v, fam, fl: True, 8, "two 128-bit pipes assumed"),
)


@functools.lru_cache(maxsize=None)
def cpu_peak_fma() -> Dict[str, object]:
    """This CPU's peak single-precision FMA rate per core: :data:`FMA_PEAKS`' lanes per cycle for its vendor,
    family and lscpu flags, times the clock (lscpu's max MHz when given, else /proc/cpuinfo's MHz: a VM often
    shows only the nominal clock). x 2 for FLOP/s.
    """
    flags, mhz, model, vendor, family = set(), None, platform.processor() or "unknown", "", 0
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if key == "Flags":
                flags = set(val.split())
            elif key == "CPU max MHz" and val:
                mhz = float(val)
            elif key == "Model name":
                model = val
            elif key == "Vendor ID":
                vendor = val
            elif key == "CPU family" and val.isdigit():
                family = int(val)
    except (OSError, subprocess.SubprocessError):
        pass
    if mhz is None:
        try:
            mhz = max(float(l.split(":")[1]) for l in Path("/proc/cpuinfo").read_text().splitlines()
                      if l.startswith("cpu MHz"))
        except (OSError, ValueError):
            mhz = float("nan")
    row = next(i for i, (_, match, _, _) in enumerate(FMA_PEAKS) if match(vendor, family, flags))
    name, _, lanes_per_cycle, how = FMA_PEAKS[row]
    isa = "avx512f" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "sse"
    return {"model": model, "vendor": vendor, "family": family, "isa": isa, "microarchitecture": name,
            "datapath": how, "table_row": row, "fma_lanes_per_cycle": lanes_per_cycle, "clock_ghz": mhz / 1000.0,
            "peak_fma_per_s_per_core": lanes_per_cycle * mhz * 1e6}


def fma_peak_table(peak: Dict[str, object]) -> str:
    """:data:`FMA_PEAKS` as a Markdown table at ``peak``'s clock, this machine's row marked."""
    rows = "".join(f"| {'**' + name + '** (this machine)' if i == peak['table_row'] else name} | {lanes} | {how} | "
                   f"{lanes * peak['clock_ghz']:.1f} |\n" for i, (name, _, lanes, how) in enumerate(FMA_PEAKS))
    return ("| microarchitecture | FP32 FMA lanes / cycle / core | datapath | peak G FMA/s / core at "
            f"{peak['clock_ghz']:.2f} GHz |\n|---|---|---|---|\n" + rows)


def memory_bandwidth(mib: int = 512, repeats: int = 5) -> Dict[str, float]:
    """Main-memory bandwidth as a copy of ``mib`` MiB (STREAM's copy: bytes read + bytes written), best of
    ``repeats``, on one thread and on all of torch's threads: GB/s."""
    n = mib * 2 ** 20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    out, threads = {}, torch.get_num_threads()
    for key, t in (("one_thread_gb_s", 1), ("all_threads_gb_s", threads)):
        torch.set_num_threads(t)
        best = timeit(lambda: dst.copy_(src), repeats=repeats, warmup=1)["min_s"]
        out[key] = 2 * 4 * n / best / 1e9
    torch.set_num_threads(threads)
    out["threads"], out["mib"] = threads, mib
    return out
