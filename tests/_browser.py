"""Shared helpers of the browser tests (headless Debian chromium driven by playwright-core)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import pytest

BROWSER_DIR = Path(__file__).resolve().parent / "browser"
SETUP = "`make test` installs it (scripts/setup_system.sh test; see the README's set-up section)"


def find_chromium() -> Optional[str]:
    """``$RH3DGS_CHROMIUM`` when set (None unless it is an executable), else ``chromium`` on PATH."""
    exe = os.environ.get("RH3DGS_CHROMIUM")
    if exe:
        return exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else None
    return shutil.which("chromium")


def browser_ready() -> Tuple[Optional[str], str]:
    """(chromium path, "") when chromium, node and the driver (playwright-core) are installed, else (None, why)."""
    chromium = find_chromium()
    if chromium is None:
        exe = os.environ.get("RH3DGS_CHROMIUM")
        what = f"RH3DGS_CHROMIUM={exe} is not an executable" if exe else "Debian chromium is not installed (no `chromium` on PATH)"
        return None, f"{what}: {SETUP}"
    if shutil.which("node") is None:
        return None, f"node is not installed: {SETUP}"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return None, f"the browser driver (playwright-core, tests/browser/node_modules) is not installed: {SETUP}"
    return chromium, ""


def require_browser() -> str:
    """The chromium path for a browser test; the test FAILS (never skips) with the reason when one is missing."""
    chromium, why = browser_ready()
    if chromium is None:
        pytest.fail(f"browser test cannot run: {why}", pytrace=False)
    return chromium


def run_driver(script: str, args, chromium: str, timeout: float) -> dict:
    """Run ``tests/browser/<script>`` with node; assert it succeeded and return its JSON result line."""
    drv = subprocess.run(["node", str(BROWSER_DIR / script), *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, cwd=BROWSER_DIR, env=dict(os.environ, CHROMIUM=chromium))
    assert drv.returncode == 0, drv.stderr[-3000:] + drv.stdout[-2000:]
    return json.loads(drv.stdout.strip().splitlines()[-1])


def read_viewer_url(proc: subprocess.Popen, timeout: float) -> Tuple[Optional[str], list]:
    """The ``http://127.0.0.1:PORT`` that ``rh3dgs view`` prints (its stdout a text pipe), read line by line for
    up to ``timeout`` seconds; (None, lines) if it exits or stays silent. Returns (url, lines read)."""
    import re
    import time

    url, lines, t0 = None, [], time.time()
    while url is None and time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"open (http://127\.0\.0\.1:\d+)", line)
        url = m.group(1) if m else None
    return url, lines


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
