"""rh3dgs.nerfstudio.run_guard: nerfstudio's own reads of a run's config.yml build no arbitrary objects.

nerfstudio 1.1.5 reads config.yml with ``yaml.Loader`` in ``ns-train --load-config`` (scripts/train.py)
and in ``eval_setup`` (ns-eval, ns-viewer, ns-export, ns-render). With the plugin loaded (importing
rh3dgs.nerfstudio.config, which nerfstudio's method discovery does) both go through rh3dgs' loader: a
``!!python/object/apply:os.system`` payload creates nothing and ends in one line naming the file. The
slow test runs the five real commands in subprocesses.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

import rh3dgs.nerfstudio.config as ns_config  # installs the guard, as nerfstudio's discovery does
from rh3dgs.errors import ConfigError
from rh3dgs.io.nerfstudio_run import NerfstudioRunError
from rh3dgs.nerfstudio import run_guard

BIN = Path(sys.executable).parent


def _run_config(root: Path, payload: str = "") -> Path:
    """A run folder as ns-train lays it out (root/outputs/e/rh3dgs-lite/t/config.yml); ``payload`` replaces the
    experiment_name line."""
    c = ns_config.rh3dgs_lite_config()
    c.output_dir, c.experiment_name, c.timestamp = root / "outputs", "e", "t"
    text = yaml.dump(c)
    if payload:
        text = "\n".join(f"experiment_name: {payload}" if ln.startswith("experiment_name:") else ln
                         for ln in text.splitlines()) + "\n"
    run = root / "outputs" / "e" / "rh3dgs-lite" / "t"
    run.mkdir(parents=True)
    (run / "config.yml").write_text(text)
    return run / "config.yml"


def _payload(marker: Path) -> str:
    return f'!!python/object/apply:os.system ["touch {marker}"]'


def test_the_plugin_module_installs_the_guard():
    assert run_guard.installed() and yaml.load is run_guard._guarded_load


def test_ns_train_and_eval_setup_read_a_payload_and_create_nothing(tmp_path, monkeypatch):
    from nerfstudio.engine.trainer import TrainerConfig
    from nerfstudio.scripts.train import main as ns_train_main
    from nerfstudio.utils.eval_utils import eval_setup

    marker = tmp_path / "MARKER"
    cfg = _run_config(tmp_path, _payload(marker))
    monkeypatch.chdir(tmp_path)
    before = sorted(p for p in tmp_path.rglob("*"))
    for call in (lambda: eval_setup(cfg), lambda: ns_train_main(TrainerConfig(load_config=cfg))):
        with pytest.raises(NerfstudioRunError) as ei:
            call()
        msg = str(ei.value)
        assert msg.startswith(f"{cfg}: line ") and "os.system is not allowed" in msg and "\n" not in msg, msg
    assert not marker.exists() and sorted(tmp_path.rglob("*")) == before  # nothing created


def _nerfstudio_caller(module: str):
    """``yaml.load(text, Loader)`` called from code whose module is ``module`` (as nerfstudio's scripts call it)."""
    scope = {"__name__": module, "yaml": yaml}
    exec(compile("def load(text, loader):\n    return yaml.load(text, Loader=loader)\n", "<ns>", "exec"), scope)
    return scope["load"]


def test_valid_configs_read_as_yaml_loader_reads_them_and_other_callers_pass_through(tmp_path):
    cfg = _run_config(tmp_path)
    text = cfg.read_text()
    ours = _nerfstudio_caller("nerfstudio.scripts.train")(text, yaml.Loader)
    theirs = run_guard._yaml_load(text, Loader=yaml.Loader)  # nerfstudio's own reading, unguarded
    assert ours == theirs and type(ours) is type(theirs)
    # callers outside nerfstudio, and safe loaders anywhere, get PyYAML unchanged
    assert yaml.load("a: !!python/tuple [1, 2]", Loader=yaml.Loader) == {"a": (1, 2)}
    assert _nerfstudio_caller("nerfstudio.x")("a: [1, 2]", yaml.SafeLoader) == {"a": [1, 2]}
    assert run_guard.config_path_from_argv(["--load-config=a.yml"]) == "a.yml"
    assert run_guard.config_path_from_argv(["rh3dgs-lite", "--load-config", "b.yml"]) == "b.yml"


def _flip(path: Path, record_suffix: str, n: int = 100) -> None:
    """Flip ``n`` bytes inside the stored data of the zip record whose name ends with ``record_suffix``."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(record_suffix))
    data = bytearray(path.read_bytes())
    extra = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + len(info.filename.encode()) + extra
    for k in range(n):
        data[start + (k * 7919) % info.file_size] ^= 0xA5
    path.write_bytes(bytes(data))


def test_eval_setup_refuses_a_damaged_checkpoint_before_torch_reads_it(tmp_path):
    from nerfstudio.utils.eval_utils import eval_setup

    cfg = _run_config(tmp_path)
    models = cfg.parent / "nerfstudio_models"
    models.mkdir()
    ckpt = models / "step-000000005.ckpt"
    torch.save({"step": 5, "pipeline": {"_model.gauss_params.means": torch.randn(50, 3)}}, ckpt)
    _flip(ckpt, "data/0")
    with pytest.raises(NerfstudioRunError, match=r"step-000000005.ckpt: checksum \(CRC-32\) mismatch"):
        eval_setup(cfg)
    ckpt.write_bytes(ckpt.read_bytes()[:300])  # truncated
    with pytest.raises(NerfstudioRunError, match="step-000000005.ckpt: not a complete checkpoint"):
        eval_setup(cfg)


def test_uncaught_errors_of_ours_end_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv("RH3DGS_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["/x/bin/ns-train"])
    seen = []
    hook = run_guard._excepthook(lambda *a: seen.append(a))
    hook(ConfigError, ConfigError("a\nb"), None)
    assert capsys.readouterr().err == "ns-train: error: a b\n" and not seen
    err = ValueError("theirs")
    hook(ValueError, err, None)  # anything else: the previous hook (a traceback)
    assert seen == [(ValueError, err, None)]


COMMANDS = {
    "ns-train": ["rh3dgs-lite", "--load-config", "{cfg}"],
    "ns-eval": ["--load-config", "{cfg}", "--output-path", "eval.json"],
    "ns-viewer": ["--load-config", "{cfg}"],
    "ns-export": ["gaussian-splat", "--load-config", "{cfg}", "--output-dir", "export"],
    "ns-render": ["interpolate", "--load-config", "{cfg}", "--output-path", "render.mp4"],
}


@pytest.mark.slow
def test_every_ns_command_refuses_a_python_tag_and_creates_nothing(tmp_path):
    """The real console scripts, the plugin found through its entry point (or NERFSTUDIO_METHOD_CONFIGS)."""
    from rh3dgs.nerfstudio import METHOD_CONFIGS_ENV
    from importlib.metadata import entry_points

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")])))
    if not any(ep.value.startswith("rh3dgs.") for ep in entry_points(group="nerfstudio.method_configs")):
        env["NERFSTUDIO_METHOD_CONFIGS"] = METHOD_CONFIGS_ENV
    marker = tmp_path / "MARKER"
    cfg = _run_config(tmp_path, _payload(marker))
    before = sorted(tmp_path.rglob("*"))
    # ns-export imports open3d before anything (nerfstudio's exporter), and open3d needs libusb at import: on a
    # machine without it ns-export cannot start at all, whatever the config (scripts/setup_system.sh colmap)
    open3d = subprocess.run([sys.executable, "-c", "import open3d"], env=env, capture_output=True).returncode == 0
    tried = []
    for cmd, args in COMMANDS.items():
        if cmd == "ns-export" and not open3d:
            continue
        tried.append(cmd)
        p = subprocess.run([str(BIN / cmd), *[a.format(cfg=cfg) for a in args]], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        ours = [ln for ln in p.stderr.splitlines() if ln.startswith(f"{cmd}: error: ")]
        assert p.returncode != 0 and len(ours) == 1 and "Traceback" not in p.stderr + p.stdout, (cmd, p.stderr[-3000:])
        assert f"{cfg}: line " in ours[0] and "os.system is not allowed" in ours[0], ours
        new = sorted(set(tmp_path.rglob("*")) - set(before))
        # ns-export makes its (empty) --output-dir before it reads the config: nerfstudio's, not the payload's
        assert not marker.exists() and all(p.is_dir() and not any(p.iterdir()) for p in new), (cmd, new)
        for p in new:
            p.rmdir()
    if not open3d:
        pytest.skip(f"{', '.join(tried)} refused the tag and created nothing; ns-export not run: open3d cannot be "
                    "imported here (it needs libusb-1.0: scripts/setup_system.sh colmap)")
