"""Fuzz targets for the ``rh3dgs`` command line: hostile argument lists, and scene folders with one file
tampered, driven through ``rh3dgs.cli.main`` (shared by ``tests/test_fuzz_cli.py``).

A run *passes* when ``main(argv)`` returns 0, or returns 2 after exactly one stderr line
``rh3dgs: error: ...``; any exception (a traceback), another exit code, a multi-line error or a call
over ``fuzz.targets.CALL_TIMEOUT_S`` is a bug.

    from fuzz.cli_args import run_cli
    run_cli(["query", "SCENE", "red mug", "--views", "abc", "--output", "OUT"], work)
"""
from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Dict, List, Sequence

from fuzz.targets import time_limit

#: flags of each command the fuzzer draws from (the view server, the demo and the suite are left out:
#: they serve forever or run for minutes on valid input)
COMMANDS: Dict[str, Sequence[str]] = {
    "synth": ("--output", "--seed", "--views", "--size", "--overwrite"),
    "render": ("--transforms", "--output", "--downscale", "--skip-missing-images", "--no-undistort", "--overwrite"),
    "extract": ("--data", "--teacher", "--features-dir", "--cache", "--checkpoint", "--downscale"),
    "lift": ("--data", "--output", "--method", "--no-vcd", "--no-guided", "--delta", "--iters", "--latent-dim",
             "--views-per-batch", "--streaming", "--config", "--teacher", "--features-dir", "--downscale",
             "--overwrite"),
    "query": ("--negatives", "--threshold", "--views", "--output", "--overwrite"),
    "select": ("--threshold", "--negatives", "--output", "--latents", "--latent-dtype", "--overwrite"),
    "export": ("--output", "--latents", "--latent-dtype", "--overwrite"),
    "eval": ("--data", "--output", "--overwrite"),
}
GLOBALS = ("--max-memory",)  # --debug re-raises by design (a traceback): not drawn

#: values an option may get: valid ones, and each kind of wrong one
NUMBERS = ["0", "1", "2", "-1", "3.5", "1e3", "nan", "inf", "-inf", "99999999999999999999", "abc", "", " ",
           "0x10", "1,2", "١"]
WORDS = ["red mug", "chair", "red mug;chair", ";", "", "x" * 300, "a/b", "..", "\u00e9\u4e2d", "--output",
         "robust", "euclidean", "karcher", "float16", "float32", "precomputed", "tiny-clip", "dino", "0,1",
         "0,0", "abc", "-1", "1G", "1K", "lots"]


def path_pool(work: Path, seeds: Path) -> List[str]:
    """Paths an argument may name: the valid inputs, and missing / folder / file / device / long ones."""
    (work / "afile").write_text("x")
    (work / "adir").mkdir(exist_ok=True)
    return [str(seeds / "scene.ply"), str(seeds / "data"), str(seeds / "data" / "transforms.json"),
            str(work / "scene"), str(work / "scene" / "semantic.ply"), str(work / "out"), str(work / "out.ply"),
            str(work / "missing.ply"), str(work / "afile"), str(work / "afile" / "below.ply"), str(work / "adir"),
            str(work / ("y" * 300)), "/proc/x.ply", "/dev/null", "", str(seeds / "ascii.ply"),
            str(Path(__file__).resolve().parents[2] / "configs" / "lift-robust.yaml")]


def templates(work: Path, seeds: Path) -> Dict[str, List[str]]:
    """One valid command line per command (``OUT`` stands for a fresh output path); the fuzzer edits them."""
    data = work / "featdata"
    if not data.exists():  # the seed dataset with precomputed teacher features
        shutil.copytree(seeds / "data", data)
        (data / "features").mkdir()
        shutil.copy(seeds / "feat.npy", data / "features" / "img0.npy")
        shutil.copy(seeds / "text_embeddings.npz", data / "features" / "text_embeddings.npz")
    ply, scene = str(seeds / "scene.ply"), str(scene_copy(work, seeds))
    return {
        "synth": ["synth", "--output", "OUT", "--views", "2", "--size", "8"],
        "render": ["render", ply, "--transforms", str(data), "--output", "OUT"],
        "extract": ["extract", "--data", str(data), "--teacher", "precomputed", "--cache", "OUT"],
        "lift": ["lift", ply, "--data", str(data), "--output", "OUT", "--latent-dim", "2"],
        "query": ["query", scene, "red mug", "--negatives", "chair", "--output", "OUT"],
        "select": ["select", scene, "red mug", "--negatives", "chair", "--output", "OUT.ply"],
        "export": ["export", scene, "--output", "OUT.ply"],
        "eval": ["eval", scene, "--data", str(seeds / "data")],
    }


def scene_copy(work: Path, seeds: Path) -> Path:
    """A writable copy of the seed scene folder (the fuzzed commands may be told to overwrite it)."""
    dst = work / "scene"
    if not dst.exists():
        shutil.copytree(seeds / "scene", dst)
    return dst


def run_cli(argv: List[str], timeout: float = None) -> int:
    """``rh3dgs.cli.main(argv)`` under the hang alarm; returns its exit code, raises on a bug."""
    from rh3dgs.cli import main
    from fuzz.targets import CALL_TIMEOUT_S

    err, out = io.StringIO(), io.StringIO()
    with time_limit(timeout or CALL_TIMEOUT_S), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(argv))
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 2), (argv, code, err.getvalue()[-2000:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("rh3dgs: error: "), (argv, err.getvalue()[-2000:])
    else:
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue()[-2000:])
    return code
