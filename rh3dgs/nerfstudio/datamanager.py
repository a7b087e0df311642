"""``Rh3dgsDataManager``: nerfstudio's full-image datamanager + per-view teacher feature maps.

Teacher maps come from rh3dgs's one provider :func:`rh3dgs.teachers.dataset_maps`, as for
``rh3dgs extract`` / ``rh3dgs lift``: the teacher named by ``teacher`` (``precomputed`` / ``clip`` /
``tiny-clip``) is read in place (``precomputed``) or run once per image into the on-disk feature
cache, by default ``<data>/.rh3dgs_cache`` (the CLI's default too, so features that
``rh3dgs extract`` computed are reused). Each training / eval batch carries ``batch["teacher"]``:
``[H, W, D]`` unit features at the camera's image size, or at ``teacher_size(image size)`` when
the pipeline sets it (the model's semantic loss resolution), or at the teacher's own resolution
with ``teacher_at_image_size=False``; the model resizes to its loss resolution where they differ.
Maps at the image / loss size are prepared once per camera and kept on the training device
(up to ``teacher_cache_mb``), so a training step only reads its camera's map. When the model's objective
uses VCD's mask-specificity term, batches also carry ``batch["teacher_regions"]`` ``[H, W]``: the region
fractions of the map as the teacher gives it (:func:`rh3dgs.teachers.maps.region_fraction`), once per camera,
and always ``batch["teacher_footprint"]``, the render pixels per cell of that map (:func:`rh3dgs.method.vcd.teacher_footprint`).

The training views the objective keeps as check views (``check_views``, set by the pipeline) carry no teacher
map: they train RGB only, and the model measures its semantic field on them (:mod:`rh3dgs.method.selection`).

Extraction is lazy (first batch, or :meth:`Rh3dgsDataManager.teacher_maps`), so loading a
trained run for viewing / export never needs the teacher.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Dict, List, Literal, Optional, Tuple, Type, Union

import torch

from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager, FullImageDatamanagerConfig
from nerfstudio.data.datasets.base_dataset import InputDataset
from nerfstudio.utils.rich_utils import CONSOLE

from ..ranges import Range, check_fields
from ..teachers import DatasetMaps, TeacherConfig, dataset_maps, upsample_features
from ..teachers.maps import region_fraction
from ..method.vcd import teacher_footprint

__all__ = ["Rh3dgsDataManagerConfig", "Rh3dgsDataManager"]


@dataclass
class Rh3dgsDataManagerConfig(FullImageDatamanagerConfig):
    """Full-image datamanager with teacher features."""

    _target: Type = field(default_factory=lambda: Rh3dgsDataManager)
    teacher: TeacherConfig = field(default_factory=lambda: TeacherConfig(name="precomputed"))
    """The 2D teacher (precomputed reads DATA/features/<image stem>.npy by default)."""
    teacher_cache_dir: Optional[Path] = None
    """Root of the feature cache (None: teacher.cache_dir, else DATA/.rh3dgs_cache, as rh3dgs extract)."""
    teacher_at_image_size: bool = True
    """Teacher maps at the loss's size, prepared once per camera (off: at the teacher's, resized per batch)."""
    teacher_cache_mb: Annotated[float, Range(ge=0)] = 2048.0
    """Memory for the teacher maps prepared once per camera; maps beyond it are prepared per batch."""
    cache_images: Literal["cpu", "gpu"] = "gpu"
    """gpu: on the training device (also right for CPU training: cpu pins memory, which needs CUDA)."""

    def __post_init__(self) -> None:
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        check_fields(self)  # teacher_cache_mb >= 0 (rh3dgs.ranges)


class Rh3dgsDataManager(FullImageDatamanager[InputDataset]):
    """See module docstring."""

    config: Rh3dgsDataManagerConfig

    def __init__(self, config: Rh3dgsDataManagerConfig, device: Union[torch.device, str] = "cpu", *args, **kwargs):
        if str(device).startswith("cpu") and config.cache_images == "cpu":
            config.cache_images = "gpu"  # == the device; pin_memory() would need CUDA
        cache = config.teacher_cache_dir or config.teacher.cache_dir
        if cache and getattr(config.dataparser, "image_cache_dir", "") is None:  # as the rh3dgs commands' --cache
            config.dataparser.image_cache_dir = Path(cache) / "images"
        super().__init__(config, device, *args, **kwargs)
        self._teacher_maps: Dict[str, DatasetMaps] = {}
        self._teacher_native: Dict[Tuple[str, int], torch.Tensor] = {}
        self.with_teacher = True
        """False (set by the pipeline for a model with ``semantics=False``): batches carry no teacher map."""
        self.teacher_size: Optional[Callable[[Tuple[int, int]], Tuple[int, int]]] = None
        """Image size -> size of ``batch["teacher"]`` (set by the pipeline: the model's loss resolution)."""
        self._teacher_prepared: Dict[Tuple[str, int, Tuple[int, int]], torch.Tensor] = {}
        self.with_regions = False
        """True (set by the pipeline when the model's objective reads the teacher's regions, VCD's mask-specificity
        term): batches carry ``teacher_regions`` [H, W] at the image size, computed once per camera."""
        self._teacher_regions: Dict[Tuple[str, int, Tuple[int, int]], torch.Tensor] = {}
        self.check_views: Tuple[int, ...] = ()
        """Training views whose batches carry no teacher map (set by the pipeline: the semantic objective's check
        views, :mod:`rh3dgs.method.selection`); they still train RGB."""

    # ------------------------------------------------------------------ teacher
    @property
    def data_dir(self) -> Path:
        data = Path(self.config.dataparser.data)
        return data.parent if data.is_file() else data

    def teacher_spec(self) -> Dict:
        """JSON-able spec ``{"name": ..., **kwargs}`` (for :func:`rh3dgs.teachers.teacher_from_spec`),
        defaults resolved against the data folder."""
        return self.config.teacher.spec(self.data_dir)

    def _dataset(self, split: str):
        return self.train_dataset if split == "train" else self.eval_dataset

    def dataset_maps(self, split: str) -> DatasetMaps:
        """The teacher maps of every image of ``split`` (:func:`rh3dgs.teachers.dataset_maps`; computed
        into the cache on first call; ``.stats`` says how many were computed / reused)."""
        if split not in self._teacher_maps:
            ds = self._dataset(split)
            images = [Path(p) for p in ds._dataparser_outputs.image_filenames]
            t = self.config.teacher
            teacher = t.setup(self.data_dir)
            cache = self.config.teacher_cache_dir or t.cache_dir
            maps = dataset_maps(teacher, images, cache, data_dir=self.data_dir, progress=True)  # bars at a terminal
            where = f"from {Path(maps.files[0]).parent}" if len(maps) else ""
            CONSOLE.log(f"rh3dgs teacher '{teacher.name}' ({split}): {maps.stats.get('computed', 0)} computed, "
                        f"{maps.stats.get('reused', 0)} reused{'' if maps.cached else ', read in place'} {where}")
            self._teacher_maps[split] = maps
        return self._teacher_maps[split]

    def teacher_files(self, split: str) -> List[Path]:
        """The file each image's map of ``split`` is read from (cache entries, or the teacher's own maps)."""
        return self.dataset_maps(split).files

    def teacher_map(self, split: str, idx: int, size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """[h, w, D] unit teacher features of image ``idx`` (at ``size`` = (H, W) if given), on CPU."""
        m = self._native_map(split, idx).float()
        if size is not None and tuple(m.shape[:2]) != tuple(size):
            m = upsample_features(m, size)
        return m

    def _native_map(self, split: str, idx: int) -> torch.Tensor:
        """Image ``idx``'s map as the teacher gives it, kept in half precision on CPU (read once)."""
        key = (split, int(idx))
        if key not in self._teacher_native:
            self._teacher_native[key] = self.dataset_maps(split)[idx].half()
        return self._teacher_native[key]

    def teacher_maps(self, split: str = "train") -> List[torch.Tensor]:
        """All teacher maps of a split at native resolution."""
        return [self.teacher_map(split, i) for i in range(len(self._dataset(split)))]

    def prepared_teacher_map(self, split: str, idx: int, size: Tuple[int, int]) -> torch.Tensor:
        """:meth:`teacher_map` at ``size`` on the training device, prepared once per camera and size
        (kept while the prepared maps fit in ``teacher_cache_mb``)."""
        key = (split, int(idx), tuple(size))
        m = self._teacher_prepared.get(key)
        if m is None:
            m = self.teacher_map(split, idx, size).to(self.device)
            used = sum(t.numel() * t.element_size() for t in self._teacher_prepared.values())
            if used + m.numel() * m.element_size() <= self.config.teacher_cache_mb * 2 ** 20:
                self._teacher_prepared[key] = m
        return m

    def teacher_regions(self, split: str, idx: int, size: Tuple[int, int]) -> torch.Tensor:
        """[H, W] :func:`rh3dgs.teachers.maps.region_fraction` of image ``idx``'s map as the teacher gives it
        (before any resizing), at ``size`` on the training device; computed once per camera (4 B a pixel)."""
        key = (split, int(idx), tuple(size))
        r = self._teacher_regions.get(key)
        if r is None:
            r = self._teacher_regions[key] = region_fraction(self.teacher_map(split, idx), size).to(self.device)
        return r

    def _with_teacher(self, split: str, idx: int, data: Dict) -> Dict:
        if not self.with_teacher:
            return data
        if self.with_regions:
            data["teacher_regions"] = self.teacher_regions(split, idx, tuple(data["image"].shape[:2]))
        data["teacher_footprint"] = teacher_footprint(tuple(self._native_map(split, idx).shape[:2]),
                                                      tuple(data["image"].shape[:2]))
        if self.config.teacher_at_image_size:
            size = (int(data["image"].shape[0]), int(data["image"].shape[1]))
            if self.teacher_size is not None:
                size = self.teacher_size(size)
            data["teacher"] = self.prepared_teacher_map(split, idx, size)
        else:
            data["teacher"] = self.teacher_map(split, idx).to(self.device)
        return data

    # ------------------------------------------------------------------ batches
    def next_train(self, step: int):
        camera, data = super().next_train(step)
        idx = int(camera.metadata["cam_idx"])
        if idx in self.check_views:  # held out of the semantic loss
            return camera, data
        return camera, self._with_teacher("train", idx, data)

    def next_eval_image(self, step: int):
        camera, data = super().next_eval_image(step)
        idx = int(data["image_idx"]) if "image_idx" in data else None
        if idx is None:  # pragma: no cover - InputDataset always sets image_idx
            return camera, data
        return camera, self._with_teacher("eval", idx, data)

    @property
    def fixed_indices_eval_dataloader(self):
        out = []
        for i, (camera, data) in enumerate(super().fixed_indices_eval_dataloader):
            out.append((camera, self._with_teacher("eval", i, data)))
        return out
