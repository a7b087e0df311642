"""``Rh3dgsPipeline``: nerfstudio's VanillaPipeline + semantic initialisation of the model.

After the datamanager and the model are built (training only, ``test_mode == "val"``), the
model's decoder (and with ``decoder_init="lift"`` its latents) is initialised from the
teacher maps of the training views. Loading a run (viewer, ns-eval, export) skips this:
the checkpoint holds the trained values and the teacher is not needed. With the model's
``semantics=False`` the datamanager hands out no teacher maps at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Type

import torch

from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig

from ..cameras import Cameras

__all__ = ["Rh3dgsPipelineConfig", "Rh3dgsPipeline", "train_cameras_as_rh3dgs"]


@dataclass
class Rh3dgsPipelineConfig(VanillaPipelineConfig):
    _target: Type = field(default_factory=lambda: Rh3dgsPipeline)


def train_cameras_as_rh3dgs(ns_cameras) -> Optional[Cameras]:
    """nerfstudio Cameras (one image size, pinhole) -> :class:`rh3dgs.Cameras`; None if sizes differ."""
    from .model import viewmat_from_c2w

    w, h = ns_cameras.width.reshape(-1), ns_cameras.height.reshape(-1)
    if not (bool((w == w[0]).all()) and bool((h == h[0]).all())):
        return None
    K = ns_cameras.get_intrinsics_matrices().reshape(-1, 3, 3).float()
    c2w = ns_cameras.camera_to_worlds.reshape(-1, 3, 4).float()
    return Cameras(viewmats=viewmat_from_c2w(c2w), Ks=K, width=int(w[0]), height=int(h[0]))


class Rh3dgsPipeline(VanillaPipeline):
    def __init__(self, config: Rh3dgsPipelineConfig, device: str, test_mode: Literal["test", "val", "inference"] = "val",
                 world_size: int = 1, local_rank: int = 0, grad_scaler: Optional[torch.cuda.amp.GradScaler] = None):
        super().__init__(config, device, test_mode=test_mode, world_size=world_size, local_rank=local_rank,
                         grad_scaler=grad_scaler)
        if not getattr(self.model.config, "semantics", True):
            if hasattr(self.datamanager, "with_teacher"):
                self.datamanager.with_teacher = False  # plain splatfacto: the teacher is never run
        elif test_mode == "val" and hasattr(self.model, "initialize_semantics"):
            dm = self.datamanager
            maps = dm.teacher_maps("train")
            cams = None
            if getattr(self.model.config, "decoder_init", "pca") == "lift":
                cams = train_cameras_as_rh3dgs(dm.train_dataset.cameras)
            self.model.initialize_semantics(maps, cams)
            self.model.to(device)
