"""A full disk at many points of lift / select / export / an ns-train checkpoint: one line, nothing lost.

The outputs live on a small file system: a tmpfs of a few MB mounted for the test when we are root (the real
``ENOSPC`` of the kernel), else every write through :func:`rh3dgs.io.atomic.atomic_write` is given the same
byte budget and fails with ``ENOSPC`` past it (fault injection). For each point the old output was written
first, the file system is then filled to leave ``k`` bytes, the command runs with ``--overwrite`` and must
exit 2 with one ``rh3dgs: error: cannot write ...`` line and leave the old output byte-identical and loadable
(or, with room enough, the complete new one). ``RH3DGS_TEST_NO_MOUNT=1`` forces the fault injection.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import rh3dgs
from rh3dgs.cli import main
from rh3dgs.errors import OutputError
from rh3dgs.io import atomic

MB = 1 << 20


class SmallDisk:
    """``root``: a folder on a file system of ``size`` bytes; :meth:`leave` fills it to ``k`` free bytes."""

    def __init__(self, base: Path, size: int, monkeypatch):
        self.root, self.size, self.mounted = base / "fs", size, False
        self.root.mkdir()
        if os.geteuid() == 0 and shutil.which("mount") and not os.environ.get("RH3DGS_TEST_NO_MOUNT"):
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.root)],
                               capture_output=True)
            self.mounted = r.returncode == 0
        self.budget = None
        if not self.mounted:  # fault injection: the files atomic_write makes share the budget of free bytes
            real = atomic._fdopen

            def fdopen(fd, mode, **kw):
                f = real(fd, mode, **kw)
                flush, counted = f.flush, [0]

                def checked_flush():  # the file's real size: writes through fileno() (ndarray.tofile) count too
                    flush()
                    grown = os.fstat(fd).st_size - counted[0]
                    if self.budget is not None:
                        if grown > self.budget:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        self.budget -= grown
                    counted[0] += grown

                f.flush = checked_flush
                return f

            monkeypatch.setattr(atomic, "_fdopen", fdopen)

    def leave(self, k: int) -> None:
        """Fill the file system so that ``k`` bytes stay free (tmpfs: to its 4 KiB pages)."""
        self.release()
        if not self.mounted:
            self.budget = k
            return
        free = shutil.disk_usage(self.root).free
        with open(self.root / "filler", "wb") as f:
            f.write(b"\0" * max(0, free - k))

    def release(self) -> None:
        (self.root / "filler").unlink(missing_ok=True)
        self.budget = None

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)


@pytest.fixture
def disk(tmp_path, monkeypatch):
    d = SmallDisk(tmp_path, 6 * MB, monkeypatch)
    yield d
    d.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A synthetic dataset of 2 views (~2k Gaussians) with precomputed 8-D feature maps and text embeddings."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset

    root = tmp_path_factory.mktemp("disk_data")
    data = write_dataset(make_scene(SceneConfig(num_views=2, image_size=24, gaussians_per_unit_area=150)),
                         root / "data", progress=False)["root"]
    (data / "features").mkdir()
    rng = np.random.default_rng(0)
    for name in ("frame_00000", "frame_00001"):
        np.save(data / "features" / f"{name}.npy", rng.normal(size=(6, 6, 8)).astype(np.float32) + 0.5)
    from rh3dgs.query import CANONICAL_NEGATIVES

    np.savez(data / "features" / "text_embeddings.npz",
             **{q: rng.normal(size=8).astype(np.float32) for q in ("red ball", *CANONICAL_NEGATIVES)})
    return data


def _tree(folder: Path) -> dict:
    """sha256 of every file (rh3dgs.json without its run's timing info)."""
    def digest(p: Path) -> str:
        if p.name == "rh3dgs.json":
            return json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "info"}, sort_keys=True)
        return hashlib.sha256(p.read_bytes()).hexdigest()

    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _lift(data: Path, out: Path, method: str) -> list:
    return ["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(out), "--frame", "data",
            "--method", method, "--latent-dim", "4", "--overwrite"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rh3dgs: error: cannot write "), err
    assert "Traceback" not in err[0]
    return err[0]


def _points(need: int, n: int) -> list:
    """``n`` free-space points from nothing to just short of ``need`` bytes."""
    return sorted({int(x) for x in np.linspace(0, need * 0.97, n)})


def test_lift_select_export_on_a_full_disk_keep_the_old_outputs(disk, dataset, capsys, tmp_path):
    scene = disk.root / "scene"
    assert main(_lift(dataset, scene, "robust")) == 0
    capsys.readouterr()
    old = _tree(scene)
    old_latents = rh3dgs.load(scene).field.latents.clone()
    # what the new scene needs: written once elsewhere (carried-over files are hard links: no space)
    probe = tmp_path / "probe"
    assert main(_lift(dataset, probe, "euclidean")) == 0
    capsys.readouterr()
    need = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    failures = 0
    for k in _points(need, 8):
        disk.leave(k)
        code = main(_lift(dataset, scene, "euclidean"))
        disk.release()
        if code == 0:  # tmpfs rounds to pages: the last point may just fit
            capsys.readouterr()
            assert _tree(scene) == _tree(probe)
            break
        assert code == 2 and "No space left on device" in _one_line(capsys)
        assert _tree(scene) == old and not [p for p in disk.root.iterdir() if p.name.startswith(".")]
        assert torch.equal(rh3dgs.load(scene).field.latents, old_latents)
        failures += 1
    assert failures >= 6
    disk.release()
    assert main(_lift(dataset, scene, "euclidean")) == 0  # room again: the new scene, whole
    capsys.readouterr()
    assert _tree(scene) == _tree(probe)

    # select and export: one file each, the previous one kept
    for argv in (["select", str(scene), "red ball", "--output", str(disk.root / "sel.ply"), "--threshold", "0.0"],
                 ["export", str(scene), "--output", str(disk.root / "all.ply"), "--latents"]):
        out = Path(argv[argv.index("--output") + 1])
        assert main(argv) == 0, capsys.readouterr().err
        capsys.readouterr()
        before = out.read_bytes()
        for k in _points(len(before), 4):
            disk.leave(k)
            code = main(argv + ["--overwrite"])
            disk.release()
            assert code == 2 and "No space left on device" in _one_line(capsys), argv
            assert out.read_bytes() == before


def test_ns_train_checkpoint_on_a_full_disk_keeps_the_last_one(disk):
    from rh3dgs.nerfstudio.trainer import Rh3dgsTrainer

    models = disk.root / "nerfstudio_models"
    big = torch.nn.Linear(300, 1000)  # ~1.2 MB of weights

    class Opt:
        def state_dict(self):
            return {"lr": 0.1}

    fake = SimpleNamespace(checkpoint_dir=models, pipeline=big, optimizers=SimpleNamespace(
        optimizers={"a": Opt()}, schedulers={}), grad_scaler=Opt(),
        config=SimpleNamespace(save_only_latest_checkpoint=True))
    Rh3dgsTrainer.save_checkpoint(fake, 100)
    first = (models / "step-000000100.ckpt").read_bytes()
    for k in _points(len(first), 5):
        disk.leave(k)
        with pytest.raises(OutputError, match="step-000000200.ckpt: No space left on device") as ei:
            Rh3dgsTrainer.save_checkpoint(fake, 200)
        disk.release()
        assert "\n" not in str(ei.value)
        assert sorted(p.name for p in models.iterdir()) == ["step-000000100.ckpt"]
        assert (models / "step-000000100.ckpt").read_bytes() == first
    from rh3dgs.io.nerfstudio_run import load_checkpoint

    assert load_checkpoint(models / "step-000000100.ckpt")["step"] == 100


def test_atomic_folder_swaps_whole_and_keeps_a_users_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("old a")
    (out / "notes.txt").write_text("mine")
    with atomic.atomic_folder(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.")
        (tmp / "a.txt").write_text("new a")
        (tmp / "b.txt").write_text("new b")
        assert (out / "a.txt").read_text() == "old a"  # nothing visible before the swap
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.txt": "new a", "b.txt": "new b", "notes.txt": "mine"}
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_folder(out) as tmp:
            (tmp / "a.txt").write_text("newer")
            raise KeyboardInterrupt
    assert (out / "a.txt").read_text() == "new a" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # no exchange on this system (or file system): two renames, the same result
    orig = atomic._exchange
    try:
        atomic._exchange = lambda a, b: False
        with atomic.atomic_folder(out) as tmp:
            (tmp / "a.txt").write_text("third")
    finally:
        atomic._exchange = orig
    assert (out / "a.txt").read_text() == "third" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
