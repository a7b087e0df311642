"""scripts/setup_system.sh (what `make test` installs outside pip) and .ci/run.

The script runs in a sandbox: a copy of it next to tests/browser's package files, and a PATH of
stubs (``id``, ``sudo``, ``apt-get``, ``npm``, ``node``) plus links to the few real tools it uses,
so a missing chromium, a non-root user without sudo or a machine without apt-get are simulated
without touching this machine. Each stub appends its command line to a log.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")
TOOLS = ("env", "cmp", "cp", "dirname", "sed", "cat", "mkdir", "rm", "touch", "chmod")

STUBS = {
    "id": 'if [ "$1" = -u ]; then echo "${STUB_UID:-0}"; else echo "uid=${STUB_UID:-0}"; fi',
    "sudo": 'echo "sudo $*" >> "$STUB_LOG"; exec "$@"',
    # "installs" chromium at $RH3DGS_CHROMIUM
    "apt-get": 'echo "apt-get $*" >> "$STUB_LOG"; [ -z "${STUB_APT_FAIL:-}" ] || exit 100\n'
               'case " $* " in *" install "*) printf "#!/bin/sh\\n" > "$RH3DGS_CHROMIUM"; chmod +x "$RH3DGS_CHROMIUM";; esac',
    "npm": 'echo "npm $*" >> "$STUB_LOG"\n'
           'if [ "$1" = ci ]; then rm -rf "$3/node_modules"; mkdir -p "$3/node_modules/playwright-core"; fi',
    "node": 'echo "node $*" >> "$STUB_LOG"',
}


def _exe(path: Path, body: str) -> None:
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def sandbox(tmp_path):
    """-> run(*args, stubs=..., uid=0) -> (returncode, stderr, log lines); tmp_path/repo is the repository."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup_system.sh", repo / "scripts")
    (repo / "tests" / "browser").mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(ROOT / "tests" / "browser" / name, repo / "tests" / "browser")
    tools = tmp_path / "tools"
    tools.mkdir()
    for t in TOOLS:
        os.symlink(shutil.which(t), tools / t)
    os.symlink(sys.executable, tools / "python3")
    log = tmp_path / "log"

    def run(*args, stubs=("id", "apt-get", "npm", "node"), uid=0, chromium=False, env=None):
        bin_ = tmp_path / f"bin-{'-'.join(sorted(stubs))}"
        if not bin_.exists():
            bin_.mkdir()
            for s in stubs:
                _exe(bin_ / s, STUBS[s])
        exe = tmp_path / "chromium"
        if chromium and not exe.exists():
            _exe(exe, "exit 0")
        log.write_text("")
        e = {"PATH": f"{bin_}:{tools}", "STUB_LOG": str(log), "STUB_UID": str(uid), "RH3DGS_CHROMIUM": str(exe),
             "HOME": str(tmp_path), "PYTHON": "python3", **(env or {})}
        r = subprocess.run([BASH, str(repo / "scripts" / "setup_system.sh"), *args], env=e, capture_output=True,
                           text=True, timeout=60)
        return r.returncode, r.stderr, log.read_text().splitlines()

    run.repo = repo
    run.chromium = tmp_path / "chromium"
    return run


def test_dry_run_prints_the_install_and_changes_nothing(sandbox):
    rc, err, log = sandbox("--dry-run", "test")
    assert rc == 0, err
    assert "rh3dgs set-up: missing chromium (headless browser of the browser tests)" in err
    assert "+ apt-get update -qq" in err
    assert "+ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium\n" in err
    assert "+ npm ci --prefix tests/browser --no-audit --no-fund" in err
    assert log == [] and not sandbox.chromium.exists() and not (sandbox.repo / "tests/browser/node_modules").exists()


def test_not_root_goes_through_sudo(sandbox):
    rc, err, _ = sandbox("--dry-run", "test", stubs=("id", "sudo", "apt-get", "npm", "node"), uid=1000)
    assert rc == 0, err
    assert "+ sudo apt-get update -qq" in err
    assert "+ sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium\n" in err


def test_no_root_no_sudo_names_the_packages(sandbox):
    for dry in (["--dry-run"], []):
        rc, err, log = sandbox(*dry, "test", stubs=("id", "apt-get"), uid=1000)
        assert rc == 1
        assert "cannot install chromium nodejs npm: not root, and sudo is not installed." in err
        assert "sudo apt-get install -y chromium nodejs npm" in err
        assert log == []  # nothing was run


def test_no_apt_get_names_the_packages(sandbox):
    rc, err, log = sandbox("test", stubs=("id", "npm", "node"))
    assert rc == 1 and log == []
    assert "cannot install chromium: no apt-get on this machine (not Debian / Ubuntu)." in err
    assert f"RH3DGS_CHROMIUM={sandbox.chromium} is set but is not an executable file" in err


def test_installs_what_is_missing_then_nothing(sandbox):
    rc, err, log = sandbox("test")
    assert rc == 0, err
    assert log == ["apt-get update -qq", "apt-get install -y -qq chromium",
                   "npm ci --prefix tests/browser --no-audit --no-fund"]
    nm = sandbox.repo / "tests/browser/node_modules"
    assert (nm / "playwright-core").is_dir() and sandbox.chromium.exists()
    assert (nm / ".rh3dgs-package-lock.json").read_bytes() == (nm.parent / "package-lock.json").read_bytes()
    # idempotent: everything present -> silent, nothing run
    rc, err, log = sandbox("test")
    assert (rc, err, log) == (0, "", [])
    # a changed lock file (a new npm package) -> npm ci again, and only that
    lock = nm.parent / "package-lock.json"
    lock.write_text(lock.read_text().replace('"requires": true', '"requires": true '))
    rc, err, log = sandbox("test")
    assert rc == 0 and log == ["npm ci --prefix tests/browser --no-audit --no-fund"]
    # an empty node_modules (deleted by hand) -> npm ci again
    shutil.rmtree(nm)
    nm.mkdir()
    rc, err, log = sandbox("test")
    assert rc == 0 and log == ["npm ci --prefix tests/browser --no-audit --no-fund"]


def test_apt_get_failure_names_the_packages(sandbox):
    rc, err, log = sandbox("test", env={"STUB_APT_FAIL": "1"})
    assert rc == 1 and log == ["apt-get update -qq"]
    assert "cannot install chromium: apt-get update failed." in err
    assert not (sandbox.repo / "tests/browser/node_modules").exists()


def test_build_group_checks_the_interpreter(sandbox, tmp_path):
    py = tmp_path / "py-no-ensurepip"
    _exe(py, f'case "$*" in *ensurepip*) exit 1;; esac; exec {sys.executable} "$@"')
    os.symlink(shutil.which("g++") or shutil.which("c++") or "/bin/true", tmp_path / "tools" / "c++")
    rc, err, _ = sandbox("--dry-run", "build", env={"PYTHON": str(py)})
    assert rc == 0, err
    assert f"missing python3-venv (venv module of {py}, creates .venv)" in err
    assert "apt-get install -y -qq python3-venv\n" in err
    rc, err, _ = sandbox("--dry-run", "build")  # this interpreter: nothing missing
    assert (rc, err) == (0, "")


def test_ci_run_only_calls_the_readme_test_command():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    assert code == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "exec make test"]
    assert not any("apt-get" in ln or "npm" in ln for ln in lines)
    assert "\nmake test\n" in (ROOT / "README.md").read_text()


def test_make_test_runs_the_setup_first():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not make's child
    r = subprocess.run(["make", "-n", "-W", "requirements.txt", "test"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    cmds = r.stdout.splitlines()
    build = next(i for i, c in enumerate(cmds) if "scripts/setup_system.sh build" in c)
    venv = next(i for i, c in enumerate(cmds) if "-m venv" in c)
    setup = next(i for i, c in enumerate(cmds) if c.strip() == "scripts/setup_system.sh test")
    pytest_ = next(i for i, c in enumerate(cmds) if "-m pytest" in c)
    assert build < venv < setup < pytest_


def test_colmap_group_installs_what_ns_process_data_and_ns_export_need(sandbox, tmp_path):
    py = tmp_path / "py-no-libusb"
    _exe(py, f'case "$*" in *libusb*) exit 1;; esac; exec {sys.executable} "$@"')
    rc, err, log = sandbox("--dry-run", "colmap", env={"PYTHON": str(py)})
    assert rc == 0, err
    assert "missing colmap (structure from motion, run by ns-process-data images (poses + seed points))" in err
    assert "missing ffmpeg (image copies and downscales of ns-process-data images)" in err
    assert "missing libusb-1.0-0 (libusb-1.0.so.0, needed to import open3d (ns-export))" in err
    assert "+ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq colmap ffmpeg libusb-1.0-0\n" in err
    assert log == [] and "npm" not in err  # the browser driver is the test group's
    rc, err, _ = sandbox("--dry-run", "bogus")
    assert rc == 2 and "groups: build, test, colmap" in err
