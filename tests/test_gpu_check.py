"""benchmarks/gpu_check.py dry run on CPU (the same code path the GPU script runs on CUDA)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "rasterize.v_means2d" in md and "lic_infonce.grad" in md and "RGB + semantic" in md
    assert (tmp_path / "gpu_check.json").is_file()


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")]).returncode == 0
