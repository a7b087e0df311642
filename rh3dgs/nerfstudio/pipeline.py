"""``Rh3dgsPipeline``: nerfstudio's VanillaPipeline + the semantic model's wiring to the data manager and the
viewer's guard.

Before anything is built, the pipeline installs :mod:`rh3dgs.viewer.guard` for nerfstudio's viewer
(:func:`rh3dgs.nerfstudio.viewer.install_viewer_guard`): ``ns-train``'s trainer and ``ns-viewer`` both build the
pipeline before the viewer's server, so every run of an rh3dgs method, semantic or not, binds 127.0.0.1
unless ``--viewer.websocket-host`` names another address. After the datamanager and the model are built:

* a semantic model (:class:`~rh3dgs.nerfstudio.model.Rh3dgsModel`) gets its teacher maps at the size its
  objective compares them at (the teacher's own grid with ``resolution='teacher'``, else the image size:
  :meth:`~rh3dgs.nerfstudio.model.Rh3dgsModel.teacher_size`): the data manager prepares each camera's map
  there once and keeps it; for training (``test_mode == "val"``) its latents and decoder are initialised
  from the teacher maps of the training views (by default the training-free lift on the initial
  Gaussians), and the objective's check views (:mod:`rh3dgs.method.selection`) are handed to the model and
  left out of the data manager's semantic batches. Loading a run (viewer, ns-eval, export) skips the
  initialisation: the checkpoint holds the trained values.
* the plain splatfacto model (``ns-train splatfacto-native``) gets no teacher maps at all: the teacher never runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Optional, Tuple, Type

import torch

from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig

from ..cameras import Cameras
from .datamanager import Rh3dgsDataManager
from .model import Rh3dgsModel
from .splatfacto_native import viewmat_from_c2w
from .viewer import install_viewer_guard

__all__ = ["Rh3dgsPipelineConfig", "Rh3dgsPipeline", "train_cameras_as_rh3dgs", "teacher_size_for"]


@dataclass
class Rh3dgsPipelineConfig(VanillaPipelineConfig):
    _target: Type = field(default_factory=lambda: Rh3dgsPipeline)


def train_cameras_as_rh3dgs(ns_cameras) -> Optional[Cameras]:
    """nerfstudio Cameras (one image size, pinhole) -> :class:`rh3dgs.Cameras`; None if sizes differ."""
    w, h = ns_cameras.width.reshape(-1), ns_cameras.height.reshape(-1)
    if not (bool((w == w[0]).all()) and bool((h == h[0]).all())):
        return None
    K = ns_cameras.get_intrinsics_matrices().reshape(-1, 3, 3).float()
    c2w = ns_cameras.camera_to_worlds.reshape(-1, 3, 4).float()
    return Cameras(viewmats=viewmat_from_c2w(c2w), Ks=K, width=int(w[0]), height=int(h[0]))


def teacher_size_for(dm: Rh3dgsDataManager, model: Rh3dgsModel) -> Callable[[Tuple[int, int]], Tuple[int, int]]:
    """Image size -> the size of ``batch["teacher"]``: the model's comparison size for the dataset's maps
    (their grid is read from the first training map, once, when the first batch is made)."""
    shape = []

    def size(image_size: Tuple[int, int]) -> Tuple[int, int]:
        if not shape:
            shape.append(tuple(dm.teacher_map("train", 0).shape))
        return model.teacher_size(image_size, shape[0])

    return size


class Rh3dgsPipeline(VanillaPipeline):
    def __init__(self, config: Rh3dgsPipelineConfig, device: str, test_mode: Literal["test", "val", "inference"] = "val",
                 world_size: int = 1, local_rank: int = 0, grad_scaler: Optional[torch.cuda.amp.GradScaler] = None):
        install_viewer_guard()  # before nerfstudio's viewer starts its server: the pipeline comes first
        super().__init__(config, device, test_mode=test_mode, world_size=world_size, local_rank=local_rank,
                         grad_scaler=grad_scaler)
        dm, model = self.datamanager, self.model
        semantic = isinstance(model, Rh3dgsModel)
        if isinstance(dm, Rh3dgsDataManager):
            dm.with_teacher = semantic  # plain splatfacto: the teacher is never run
            dm.teacher_size = teacher_size_for(dm, model) if semantic else None
            dm.with_regions = semantic and model.objective.uses_regions
        if semantic and test_mode == "val":
            cams = train_cameras_as_rh3dgs(dm.train_dataset.cameras)
            maps = dm.teacher_maps("train")
            check = model.set_check_views(cams, maps)  # before the start: it is the lift of the other views
            model.initialize_semantics(maps, cams if model.config.init == "lift" else None)
            model.to(device)
            if isinstance(dm, Rh3dgsDataManager):
                dm.check_views = tuple(check)
