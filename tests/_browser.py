"""Shared helpers of the browser tests (headless Debian chromium driven by playwright-core)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

BROWSER_DIR = Path(__file__).resolve().parent / "browser"


def browser_ready():
    """(chromium path, "") when chromium, node and playwright-core are installed, else (None, why)."""
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if chromium is None:
        return None, "Debian chromium is not installed (apt-get install -y chromium)"
    if shutil.which("node") is None:
        return None, "node is not installed"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").exists():
        return None, "playwright-core is not installed (npm ci --prefix tests/browser)"
    return chromium, ""


def run_driver(script: str, args, chromium: str, timeout: float) -> dict:
    """Run ``tests/browser/<script>`` with node; assert it succeeded and return its JSON result line."""
    drv = subprocess.run(["node", str(BROWSER_DIR / script), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, cwd=BROWSER_DIR, env=dict(os.environ, CHROMIUM=chromium))
    assert drv.returncode == 0, drv.stderr[-3000:] + drv.stdout[-2000:]
    return json.loads(drv.stdout.strip().splitlines()[-1])


def stop_server(proc: subprocess.Popen, timeout: float) -> None:
    """Terminate a server process, killing it if it does not exit within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def decode_turbo(img, lut):
    """uint8 [H, W, 3] -> nearest turbo value in [0, 1] and the colour distance to it (``lut`` = (xs, colours))."""
    xs, cols = lut
    px = img.reshape(-1, 3).astype(np.float32)
    best = np.full(len(px), np.inf, np.float32)
    val = np.zeros(len(px), np.float32)
    for i in range(len(xs)):
        dist = ((px - cols[i]) ** 2).sum(-1)
        better = dist < best
        best[better], val[better] = dist[better], xs[i]
    return val.reshape(img.shape[:2]), np.sqrt(best).reshape(img.shape[:2])
