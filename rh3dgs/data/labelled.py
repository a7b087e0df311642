"""The labelled-dataset layout, and its one reader.

A nerfstudio dataset (``transforms.json``, ``images/``) with per-view ground truth, as
:func:`rh3dgs.data.synthetic.write_dataset` writes it::

    classes.txt          class names, one per line; line k (from 0, blank lines skipped) = class id k
    masks/<stem>.png     class id per pixel, single channel, 255 = background (no surface)
    depth/<stem>.npy     (optional) depth per pixel [H, W], 0 = background
    instances/<stem>.png (optional) instance id per pixel, single channel, 255 = background
    scene.ply            (optional) the Gaussians with a per-Gaussian ``class_id`` property

``<stem>`` is the image's file stem (the camera name). Read by the evaluation
(:mod:`rh3dgs.eval`: masks and ``class_id`` are the ground truth), by the simulated
teachers (:mod:`rh3dgs.data.teacher_sim`: masks and depth; :mod:`rh3dgs.data.teacher_sim_masks`:
instances and masks) and by the demo.
Every problem raises :class:`rh3dgs.errors.InputFileError` naming the file.

>>> ds = LabelledDataset.open("outputs/demo/data")
>>> ds.classes, ds.stems[:2]                  # (['floor', 'red ball', ...], ['frame_00000', 'frame_00001'])
>>> ds.mask("frame_00000").shape              # (H, W) int64, 255 = background
>>> masks, depths = ds.arrays(ds.stems)       # [B, H, W] int64, [B, H, W] as stored
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import InputFileError
from ..io.npy import load_npy

__all__ = ["BACKGROUND", "LabelledDataset"]

#: Mask value meaning "no surface" in ``masks/*.png``.
BACKGROUND = 255


@dataclass
class LabelledDataset:
    """An opened labelled dataset: ``classes`` (from classes.txt) and ``mask_files`` (sorted);
    masks, depths and per-Gaussian class ids are read on request."""

    root: Path
    classes: List[str]
    mask_files: List[Path]

    @classmethod
    def open(cls, root: Union[str, Path]) -> "LabelledDataset":
        """Check the folder, read classes.txt and list masks/*.png (nothing else is read yet)."""
        root = Path(root)
        if not root.is_dir():
            raise InputFileError(root, "dataset folder not found")
        path = root / "classes.txt"
        if not path.is_file():
            raise InputFileError(path, "missing: the dataset needs classes.txt (one class name per line)")
        try:
            names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise InputFileError(path, f"cannot be read as UTF-8 text ({exc})") from None
        if not names:
            raise InputFileError(path, "no class names")
        if len(set(names)) != len(names):
            raise InputFileError(path, f"duplicate class names {sorted({n for n in names if names.count(n) > 1})}")
        files = sorted((root / "masks").glob("*.png"))
        if not files:
            raise InputFileError(root / "masks", "no masks/*.png (class index per pixel, 255 = background)")
        return cls(root, names, files)

    @property
    def stems(self) -> List[str]:
        """The stems of the labelled views, sorted (mask file order)."""
        return [f.stem for f in self.mask_files]

    def mask(self, stem: str) -> np.ndarray:
        """int64 [H, W] class ids of view ``stem``, :data:`BACKGROUND` where no surface is seen."""
        return self._label_png(self.root / "masks" / f"{stem}.png", len(self.classes))

    def _label_png(self, path: Path, num_labels: Optional[int]) -> np.ndarray:
        """A single-channel label PNG as int64; values must be < num_labels or BACKGROUND (None: any)."""
        from ..io.images import open_image

        with open_image(path) as im:
            m = np.array(im)
        if m.ndim != 2 or m.dtype.kind not in "iub":
            raise InputFileError(path, f"label mask must be a single-channel integer image, got {m.dtype} "
                                       f"{list(m.shape)}")
        m = m.astype(np.int64)
        bad = (m != BACKGROUND) & ((m < 0) | (m >= (num_labels if num_labels is not None else BACKGROUND)))
        if bad.any():
            raise InputFileError(path, f"value {int(m[bad][0])} is not a class index of classes.txt "
                                       f"({len(self.classes)} classes, {BACKGROUND} = background)")
        return m

    def masks(self) -> Dict[str, np.ndarray]:
        """{stem: :meth:`mask`} of every labelled view."""
        return {s: self.mask(s) for s in self.stems}

    def depth(self, stem: str, shape: Optional[Tuple[int, int]] = None, why: str = "") -> np.ndarray:
        """[H, W] depth of view ``stem`` as stored (0 = background); ``shape``: the size it must have;
        ``why``: what needs it, said when the file is missing."""
        path = self.root / "depth" / f"{stem}.npy"
        if not path.is_file():
            raise InputFileError(path, f"missing depth map{f' ({why})' if why else ''}")
        d = load_npy(path, InputFileError, "depth map")
        if not isinstance(d, np.ndarray) or d.ndim != 2 or d.dtype.kind not in "fiu":
            raise InputFileError(path, f"depth must be a 2-D numeric array, got {getattr(d, 'dtype', type(d))} "
                                       f"{list(getattr(d, 'shape', []))}")
        if shape is not None and tuple(d.shape) != tuple(shape):
            raise InputFileError(path, f"depth shape {list(d.shape)} != mask shape {list(shape)}")
        return d

    def arrays(self, stems: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(masks [B, H, W] int64, depths [B, H, W] as stored) of the views ``stems``, in that order."""
        masks = [self.mask(s) for s in stems]
        depths = [self.depth(s, m.shape) for s, m in zip(stems, masks)]
        return torch.from_numpy(np.stack(masks)), torch.from_numpy(np.stack(depths))

    def instances(self, stems: Sequence[str]) -> torch.Tensor:
        """int64 [B, H, W] instance ids (``instances/<stem>.png``, :data:`BACKGROUND` = no surface) of ``stems``."""
        return torch.from_numpy(np.stack([self._label_png(self.root / "instances" / f"{s}.png", None) for s in stems]))

    def class_ids(self) -> Optional[np.ndarray]:
        """int64 [N] per-Gaussian class id from scene.ply's ``class_id`` (None without either)."""
        ply = self.root / "scene.ply"
        if not ply.is_file():
            return None
        from ..io.ply import load_ply

        g = load_ply(ply)
        return g.extra["class_id"].numpy().astype(np.int64) if "class_id" in g.extra else None
