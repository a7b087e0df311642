"""A lift in a torch.distributed group, for tests/test_distributed.py: ``torchrun ... tests/_dist_job.py DATA OUT``.

Every rank lifts the dataset in the process group (``rh3dgs.lifting.lift`` inside an initialised group) and
saves what it got to ``OUT/rank{R}.pt``; :func:`load` reads a dataset as ``rh3dgs lift`` does (the test's
single-process reference uses it too).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch


def load(data: Path):
    """(Gaussians, cameras, teacher maps) of a dataset folder with its precomputed features, as ``rh3dgs lift``."""
    from rh3dgs.cli import TeacherOptions, _dataset_maps, _load_cameras, _teacher_config
    from rh3dgs.io.ply import load_ply
    from rh3dgs.io.transforms import ImageOptions

    teacher = _teacher_config(TeacherOptions(name="precomputed"), data).setup(data)
    cams, images = _load_cameras(ImageOptions(), None, data, check_images=False)
    return load_ply(data / "scene.ply", latents=False), cams, _dataset_maps(None, teacher, data, images)


def main(data: Path, out: Path) -> None:
    from rh3dgs.distributed import process_group_from_env
    from rh3dgs.lifting import LiftConfig, lift

    gaussians, cams, maps = load(data)
    with process_group_from_env() as group:
        res = lift(gaussians, cams, maps, LiftConfig(iters=3), progress=False)
        torch.save({"features": res.features, "rows": res.rows, "weight": res.weight, "visibility": res.visibility,
                    "valid": res.valid, "filled": res.filled, "latents": res.latents, "decoder": res.decoder,
                    "info": res.info}, out / f"rank{group.rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
