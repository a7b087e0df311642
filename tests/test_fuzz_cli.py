"""Fuzzing the ``rh3dgs`` command line (issue 19, deliver 5): hostile argument lists over every command,
and scene folders with one of ``rh3dgs.json``, ``field.npz``, ``semantic.ply`` tampered, through
``rh3dgs.cli.main``. Every run must end with exit code 0, or 2 and one ``rh3dgs: error: ...`` line
(``tests/fuzz/cli_args.py``); never a traceback, never a hang (10 s alarm).

Bounded for CI (``RH3DGS_FUZZ_CLI_EXAMPLES`` per test, default 30, derandomized: a few seconds); the
``slow`` tests run the seeded long campaign (see docs/reliability.md, "CLI and scene-folder fuzzing").
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.cli_args import COMMANDS, GLOBALS, NUMBERS, WORDS, path_pool, run_cli, scene_copy, templates
from fuzz.targets import seed_dir

N = int(os.environ.get("RH3DGS_FUZZ_CLI_EXAMPLES", "30"))
LONG_N = int(os.environ.get("RH3DGS_FUZZ_CLI_LONG", "400"))
LONG_SEED = os.environ.get("RH3DGS_FUZZ_SEED", "20261202")
FAST = settings(max_examples=N, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
PATH_FLAGS = {"--output", "--transforms", "--data", "--features-dir", "--cache", "--checkpoint", "--config"}


@pytest.fixture(scope="module")
def work():
    """The fuzz folder, also the working directory: a hostile value in an output's place ("0", "..",
    "-1") is a relative path, and whatever it writes must land here, never in the checkout."""
    d = Path(tempfile.mkdtemp(prefix="rh3dgs_fuzz_cli_"))
    scene_copy(d, seed_dir())
    (d / "cwd").mkdir()
    old = os.getcwd()
    os.chdir(d / "cwd")
    try:
        yield d
    finally:
        os.chdir(old)
        shutil.rmtree(d, ignore_errors=True)


@st.composite
def argvs(draw, paths, templates):
    """A valid command line of one command (``fuzz.cli_args.templates``) with 1-4 edits: a value replaced
    by a hostile one (number / word / path pools), an argument dropped, a flag of the command added
    (with or without a value), a global option put in front; 1 in 10 a junk command."""
    cmd = draw(st.sampled_from(sorted(templates)))
    argv = list(templates[cmd])
    if draw(st.integers(0, 9)) == 0:
        argv[0] = draw(st.sampled_from(["", "frobnicate", "-x", "--output"]))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 3))
        i = draw(st.integers(1, max(1, len(argv) - 1)))
        if op == 0 and i < len(argv):  # a hostile value
            pool = paths if argv[i - 1] in PATH_FLAGS or not argv[i].startswith("-") and "/" in argv[i] \
                else NUMBERS + WORDS
            argv[i] = draw(st.sampled_from(pool + NUMBERS[:4]))
        elif op == 1 and i < len(argv):  # drop an argument
            del argv[i]
        elif op == 2:  # one more flag of the command
            flag = draw(st.sampled_from(COMMANDS[cmd]))
            argv += [flag] + ([] if draw(st.integers(0, 5)) == 0 else
                              [draw(st.sampled_from(paths if flag in PATH_FLAGS else NUMBERS + WORDS))])
        else:
            argv = [GLOBALS[0], draw(st.sampled_from(["1G", "100K", "lots", "", "0", "-1"]))] + argv
    return argv


def _check_argvs(work, budget):
    seeds = seed_dir()
    paths, temps = path_pool(work, seeds), templates(work, seeds)
    counter = iter(range(10 ** 9))

    @budget
    @given(argvs(paths, temps))
    def check(argv):
        n = next(counter)  # a fresh output path per run, under ``work``
        run_cli([a.replace("OUT", str(work / f"out{n}")) if a.startswith("OUT") else a for a in argv])

    check()


def test_cli_arguments_never_crash(work):
    _check_argvs(work, FAST)


# ----------------------------------------------------------------------------- scene folder, one file tampered
def _mutate(draw, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op, i = draw(st.integers(0, 3)), draw(st.integers(0, len(b)))
        if op == 0 and b:
            b[min(i, len(b) - 1)] = draw(st.integers(0, 255))
        elif op == 1:
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == 2:
            del b[i:i + draw(st.integers(1, 32))]
        else:
            b = b[:i]
    return bytes(b)


SCENE_FILES = ["rh3dgs.json", "field.npz", "semantic.ply", "transforms.json"]


def _check_scene(work, which, budget):
    original = (seed_dir() / "scene" / which).read_bytes()

    @budget
    @given(st.data())
    def check(data):
        folder = work / f"tampered_{which}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(seed_dir() / "scene", folder)
        (folder / which).write_bytes(_mutate(data.draw, original))
        out = work / f"t_{which}_{data.draw(st.integers(0, 10 ** 9))}"
        cmd = data.draw(st.sampled_from(["export", "select", "query"]))
        argv = {"export": ["export", str(folder), "--output", str(out) + ".ply"],
                "select": ["select", str(folder), "red mug", "--negatives", "chair", "--output", str(out) + ".ply"],
                "query": ["query", str(folder), "red mug;chair", "--negatives", "chair", "--output", str(out)]}[cmd]
        run_cli(argv)

    check()


@pytest.mark.parametrize("which", SCENE_FILES)
def test_tampered_scene_file(work, which):
    _check_scene(work, which, FAST)


# ----------------------------------------------------------------------------- seeded long run
def _long():
    s = settings(max_examples=LONG_N, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    if LONG_SEED == "random":
        return s
    return lambda f: hypothesis.seed(int(LONG_SEED))(s(f))


@pytest.mark.slow
def test_cli_arguments_long(work):
    _check_argvs(work, _long())


@pytest.mark.slow
@pytest.mark.parametrize("which", SCENE_FILES)
def test_tampered_scene_file_long(work, which):
    _check_scene(work, which, _long())
