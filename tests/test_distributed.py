"""The lift and the distillation over torch.distributed (rh3dgs.distributed, rh3dgs.lifting.shard, distill()):
real ``torchrun`` launches of two CPU processes (gloo) on a small synthetic scene, against one process.

Bounds (float32; the ranks sum their views' contributions in another order than one process does):

* lift: per-Gaussian lifted features within :data:`LIFT_FEATURES` (max abs), total weights within
  :data:`LIFT_WEIGHT` (relative), ``valid`` and ``filled`` exactly equal; the field's decoded features
  ``normalize(latents @ decoder.T)`` within :data:`DECODED` (the PCA of the k x k moments turns the
  moments' rounding into rotations of its trailing components, by rounding / eigengap);
* distillation with the same view order: its decoded features within :data:`DECODED` and its latents within
  :data:`DISTILL_LATENTS` (Adam normalises each step, so a gradient's rounding moves a latent by up to its
  learning rate per step), the loss history within 1e-4 (relative).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rh3dgs.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from _dist_job import load  # noqa: E402

LIFT_FEATURES = 1e-5
LIFT_WEIGHT = 1e-5
DECODED = 1e-3
DISTILL_LATENTS = 2e-3
SHARES = re.compile(r"over 2 processes \(views (\d+) \+ (\d+), Gaussians owned (\d+) \+ (\d+), seen (\d+) \+ (\d+)\)")
ORDER = ["3", "1", "4", "1", "5", "2", "6", "7", "0", "2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from rh3dgs.data.teacher_sim import simulate_teacher

    d = tmp_path_factory.mktemp("dist") / "data"
    assert main(["synth", "--output", str(d), "--views", "8", "--size", "32", "--gaussians-per-unit-area", "600",
                 "--seed", "3"]) == 0
    simulate_teacher(d, progress=False)
    return d


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", RH3DGS_QUIET="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return env


def _torchrun(*args: str) -> list:
    exe = Path(sys.executable).parent / "torchrun"
    return ([str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]) + list(args)


def _run(cmd: list, cwd: Path, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return r


def _decoded(field) -> torch.Tensor:
    return torch.nn.functional.normalize(field.latents @ field.decoder.T, dim=-1)


def _same_field(a, b, masks=("valid", "filled")) -> None:
    for m in masks:
        assert torch.equal(getattr(a, m), getattr(b, m)), m
    assert float((_decoded(a) - _decoded(b)).abs().max()) < DECODED


def _check_shares(stdout: str, views: int = 8) -> None:
    found = SHARES.findall(stdout)
    assert len(found) == 1, stdout  # rank 0 alone prints
    v0, v1, o0, o1, s0, s1 = map(int, found[0])
    assert v0 + v1 == views and v0 > 0 and v1 > 0 and o0 > 0 and o1 > 0 and s0 >= o0 // 2 and s1 > 0


def test_lift_in_a_process_group_equals_one_process(data, tmp_path):
    """Python inside an initialised group (torchrun, 2 gloo processes): each rank holds its block of the lifted
    features, every rank the whole scene's masks, weights and latents; against lift() in one process."""
    from rh3dgs.lifting import LiftConfig, lift

    _run(_torchrun("--standalone", "--nproc_per_node", "2", str(Path(__file__).parent / "_dist_job.py"), str(data),
                   str(tmp_path)), tmp_path)
    gaussians, cams, maps = load(data)
    ref = lift(gaussians, cams, maps, LiftConfig(iters=3), progress=False)
    parts = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    rows = torch.cat([p["rows"] for p in parts])
    assert torch.equal(rows.sort().values, torch.arange(len(gaussians)))  # the blocks cover the scene once
    for p in parts:
        assert float((p["features"] - ref.features[p["rows"]]).abs().max()) < LIFT_FEATURES
        for k in ("valid", "filled"):
            assert torch.equal(p[k], getattr(ref, k)), k
        assert float(((p["weight"] - ref.weight).abs() / ref.weight.abs().clamp_min(1e-12)).max()) < LIFT_WEIGHT
        assert float(((p["visibility"] - ref.visibility).abs()).max()) < LIFT_WEIGHT
        assert float((torch.nn.functional.normalize(p["latents"] @ p["decoder"].T, dim=-1)
                      - torch.nn.functional.normalize(ref.latents @ ref.decoder.T, dim=-1)).abs().max()) < DECODED
        assert p["info"]["passes"] == ref.info["passes"] and p["info"]["world_size"] == 2
    assert torch.equal(parts[0]["latents"], parts[1]["latents"])  # every rank the same field


def _distill_args(data: Path) -> list:
    return ["distill", str(data / "scene.ply"), "--data", str(data), "--steps", "8", "--views-per-step", "3",
            "--view-order", *ORDER]


@pytest.fixture(scope="module")
def one_distill(data, tmp_path_factory):
    """``rh3dgs distill --view-order ...`` in one process: the scene the distributed runs must write."""
    import rh3dgs

    out = tmp_path_factory.mktemp("one") / "scene"
    assert main([*_distill_args(data), "--output", str(out)]) == 0
    return rh3dgs.load(out).field


def _same_distill(one, two) -> None:
    _same_field(one, two, masks=("valid",))
    assert float((one.latents - two.latents).abs().max()) < DISTILL_LATENTS


def test_torchrun_distill_replays_the_single_process_order(data, one_distill, tmp_path):
    """``torchrun --nproc_per_node 2 -m rh3dgs.cli distill --view-order ...`` (the distributed lift, then the
    distillation with the views sharded) writes the scene ``rh3dgs distill`` writes in one process."""
    import rh3dgs

    r = _run(_torchrun("--standalone", "--nproc_per_node", "2", "-m", "rh3dgs.cli", *_distill_args(data), "--output",
                       str(tmp_path / "two")), tmp_path)
    _check_shares(r.stdout)
    _same_distill(one_distill, rh3dgs.load(tmp_path / "two").field)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_one_machine(data, one_distill, tmp_path):
    """``--nnodes 2``: two torchrun launches meeting at a c10d rendezvous on 127.0.0.1, one process each, run the
    distributed lift and distillation of ``rh3dgs distill``: the single process's scene again."""
    import rh3dgs

    args = _distill_args(data)
    port = _free_port()
    launches = [subprocess.Popen(_torchrun("--nnodes", "2", "--node_rank", str(i), "--nproc_per_node", "1",
                                           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                           "--rdzv-id", "rh3dgs-test", "-m", "rh3dgs.cli", *args,
                                           "--output", str(tmp_path / "two")),
                                 cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
    outs = [p.communicate(timeout=300) for p in launches]
    for p, (out, err) in zip(launches, outs):
        assert p.returncode == 0, (out[-2000:], err[-4000:])
    _check_shares("".join(out for out, _ in outs))
    _same_distill(one_distill, rh3dgs.load(tmp_path / "two").field)


def _workers(agent: int) -> dict:
    """{rank: pid} of torchrun ``agent``'s worker processes (their RANK in /proc/PID/environ)."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            env = (p / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        out.update({int(e[5:]): int(p.name) for e in env if e.startswith(b"RANK=")})
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
def test_killed_rank_stops_the_lift_and_the_rerun_resumes(data, tmp_path):
    """SIGKILL of rank 1 once a pass is checkpointed: rank 0 stops within seconds with one line naming rank 1;
    the same command again resumes after the last completed pass and writes the single process's scene."""
    import rh3dgs

    args = ["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(tmp_path / "two"), "--iters", "8",
            "--tol", "0", "--cache", str(tmp_path / "cache")]
    cmd = _torchrun("--standalone", "--nproc_per_node", "2", "-m", "rh3dgs.cli", *args)
    job = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not list((tmp_path / "cache").glob("resume/lift-*/pass-001.json")):
        assert job.poll() is None and time.monotonic() - t0 < 240, job.communicate()
        time.sleep(0.01)
    ranks = _workers(job.pid)
    for pid in ranks.values():  # hold the job where it is: pass 1 (or a later one) is complete
        os.kill(pid, signal.SIGSTOP)
    os.kill(ranks[1], signal.SIGKILL)
    t_kill = time.monotonic()
    os.kill(ranks[0], signal.SIGCONT)
    out, err = job.communicate(timeout=120)
    stopped = time.monotonic() - t_kill
    assert job.returncode != 0 and not (tmp_path / "two").exists()
    lines = [ln for ln in err.splitlines() if ln.startswith("rh3dgs: error:")]
    assert len(lines) == 1 and re.search(rf"rank 1 \(pid {ranks[1]} on [^)]+\) stopped", lines[0]), err[-3000:]
    assert stopped < 30, stopped
    print(f"rank 1 killed: the job stopped {stopped:.1f} s later: {lines[0]}")

    r = _run(cmd, tmp_path)
    assert re.search(r"resumed after pass [1-8]\)", r.stdout), r.stdout
    assert not list((tmp_path / "cache").glob("resume/lift-*"))  # done: the checkpoints are gone
    assert main([*args[:4], "--output", str(tmp_path / "one"), "--iters", "8", "--tol", "0"]) == 0
    _same_field(rh3dgs.load(tmp_path / "one").field, rh3dgs.load(tmp_path / "two").field)


def test_ns_train_refuses_more_than_one_device():
    """``ns-train rh3dgs-lite --machine.num-devices 2`` stops in nerfstudio's main with one line naming what to use,
    before it writes a config or starts a process."""
    pytest.importorskip("nerfstudio")
    import copy

    from nerfstudio.scripts import train

    from rh3dgs.nerfstudio.config import rh3dgs_lite_method

    cfg = copy.deepcopy(rh3dgs_lite_method.config)
    cfg.machine.num_devices = 2
    with pytest.raises(SystemExit) as exc:
        train.main(cfg)
    msg = str(exc.value)
    assert "\n" not in msg and "--machine.num-devices 2" in msg and "torchrun --nproc_per_node=K -m rh3dgs.cli" in msg
