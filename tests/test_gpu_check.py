"""benchmarks/gpu_check.sh and gpu_check.py on a CPU machine: the dry runs (the same code paths the GPU run takes)
and the report's verdict."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_gpu_check_ops_part_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "ops", "--device", "cpu", "--quick",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "gpu_check.md").read_text()
    for line in ("rasterize.v_means2d", "lic_infonce.grad", "project.v_quats", "isect_tiles.flatten_ids",
                 "aggregate.irls.acc_v", "rh3dgs RGB + 16 latents", "rh3dgs relevancy frame", "Lift of the"):
        assert line in md, line
    ops = json.loads((tmp_path / "ops.json").read_text())
    assert ops["failures"] == [] and all(v["ok"] for v in ops["agreement"].values())
    assert ops["fps"][-1]["scene"].startswith("synthetic") and ops["fps"][-1]["splatfacto RGB"] is None
    assert ops["lift"]["valid"] > 0


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")]).returncode == 0


def _path_without_nvcc() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.access(os.path.join(d, "nvcc"), os.X_OK))


@pytest.mark.slow
def test_gpu_check_dry_run_without_a_toolkit_on_path(tmp_path):
    """``gpu_check.sh --dry-run`` on a CPU machine with no nvcc on PATH (nor $CUDA_HOME): every step checked, the
    CUDA test cases collected, and the PyPI toolchain announced (or found, where an earlier install put it in this
    environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PY=sys.executable, PATH=_path_without_nvcc(), OUT_DIR=str(tmp_path / "out"))
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True,
                       timeout=600, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "DRY RUN" in out and "not a GPU machine" in out and "dry run done: 0 problem(s)" in out
    assert "will fetch the PyPI toolchain" in out or "(found through PyPI)" in out, out[-3000:]
    assert "CUDA cases collected" in out and "would run:" in out and "setup.py -q build_ext --inplace" in out
    assert not (tmp_path / "out").exists()  # a dry run writes no results


def test_report_verdict(tmp_path):
    """The report fails on a failed step, a failed CUDA test or a comparison out of tolerance; passes otherwise."""
    import gpu_check

    (tmp_path / "steps.tsv").write_text("env\tok\t12\tPY=python\nbuild\tok\t95\tCUDA ops registered\n")
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="2" failures="0" errors="0" skipped="0">'
        '<testcase classname="tests.test_ops_lic" name="test_a[cuda]"/><testcase classname="t" name="b[cuda]"/>'
        "</testsuite></testsuites>")
    assert gpu_check.report_part(tmp_path) == 0
    assert (tmp_path / "gpu_check.md").read_text().startswith("# gpu_check: PASSED")
    (tmp_path / "nstrain.json").write_text(json.dumps({"skipped": "no CUDA GPU", "failures": []}))
    (tmp_path / "steps.tsv").write_text("env\tok\t12\t\ntests\tFAILED\t80\texit 1\n")
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="1" failures="1" errors="0" skipped="0">'
        '<testcase classname="tests.test_ops_lic" name="test_a[cuda]"><failure message="x"/></testcase>'
        "</testsuite></testsuites>")
    assert gpu_check.report_part(tmp_path) == 1
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# gpu_check: FAILED") and "step tests: FAILED exit 1" in md
    assert "test tests.test_ops_lic::test_a[cuda]" in md and "skipped: no CUDA GPU" in md
    verdict = json.loads((tmp_path / "gpu_check.json").read_text())
    assert verdict["passed"] is False and len(verdict["failures"]) == 2


def test_agreement_tolerance_allows_threshold_flips_only():
    """A comparison passes with float rounding everywhere and a few pixels moved by a threshold flip (<= 2/255 of a
    feature), not with a systematic error."""
    import torch
    from gpu_check import _compare

    b = torch.randn(100_000)
    assert _compare(b + 1e-7 * torch.randn(100_000), b, 1e-4)["ok"]
    flipped = b.clone()
    flipped[:20] += 2 / 255 * 4
    assert _compare(flipped, b, 1e-4)["ok"]
    assert not _compare(b * 1.001, b, 1e-4)["ok"]
    assert not _compare(b[:-1], b, 1e-4)["ok"]  # another shape
