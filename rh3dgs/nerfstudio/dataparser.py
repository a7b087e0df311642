"""``Rh3dgsDataParser``: nerfstudio's ``nerfstudio-data`` parser on rh3dgs's image rule, seed points read with plyfile.

The images ``ns-train rh3dgs`` trains on are the ones every ``rh3dgs`` command sees, made by one function,
:func:`rh3dgs.io.transforms.load_posed_images` (the same options as ``rh3dgs extract`` / ``lift``):

* ``--skip-missing-images True`` leaves out frames whose image file is missing (one warning with the
  count), as ``rh3dgs extract --skip-missing-images``; without it, one error names them;
* ``--downscale-factor N`` uses the ``images_N`` folder when it holds every frame, else the images resized
  into the cache (nerfstudio 1.1.5 needs the folder); unset, nerfstudio's own rule (the largest existing
  ``images_2^k`` folder that keeps the image over 1600 px);
* OpenCV lens distortion (``k1 k2 p1 p2 [k3]``, with or without ``camera_model``) is undistorted once, into
  the cache (nerfstudio would undistort in memory on every start, and the teacher would see other images);
* image sizes are checked against ``w`` / ``h``, and every problem is one :class:`~rh3dgs.errors.CameraFormatError`
  naming ``transforms.json`` and the field.

When the images are not the dataset's own files (undistorted, resized, or frames left out), nerfstudio's parser
reads a derived ``transforms.json`` beside them in the cache: the kept frames, their images, pinhole intrinsics,
absolute paths; everything else (poses, splits, orientation, centring and scale) stays nerfstudio's, so
``dataparser_transforms.json`` maps the run back to the dataset's frame as before. The teacher maps of the data
manager are then those of the very files ``rh3dgs extract`` cached (:mod:`rh3dgs.teachers.cache`).

The seed point cloud (``ply_file_path`` in ``transforms.json``, written by ``ns-process-data``) is read with
plyfile instead of open3d (which cannot be imported on a machine without ``libusb-1.0.so.0``), then nerfstudio's
own transform is applied, so the points land in the same normalised frame as the cameras::

    xyz_ns = (T @ [x, y, z, 1]^T) * s        T = dataparser_transform [3, 4], s = dataparser_scale

No seed points: the model starts from random Gaussians (``rh3dgs-lite``: 4,000). Both rh3dgs methods
(``ns-train rh3dgs`` / ``rh3dgs-lite``) use this parser, with ``load_3D_points=True``; on their command
line it is the default ``nerfstudio-data`` subcommand (tyro keeps the method's config instance)::

    ns-train rh3dgs-lite --data data/fox nerfstudio-data --downscale-factor 8 --skip-missing-images True

Example::

    >>> from rh3dgs.nerfstudio.dataparser import read_seed_points
    >>> xyz, rgb = read_seed_points("data/synth/sparse_pc.ply")     # doctest: +SKIP
    >>> xyz.shape, rgb.dtype                                          # doctest: +SKIP
    (torch.Size([4031, 3]), torch.uint8)
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import numpy as np
import torch

from nerfstudio.data.dataparsers.nerfstudio_dataparser import Nerfstudio, NerfstudioDataParserConfig
from nerfstudio.utils.rich_utils import CONSOLE

from ..errors import CameraFormatError, PlyFormatError
from ..io.atomic import atomic_save_json
from ..io.transforms import PosedImages, load_posed_images, nerfstudio_downscale

__all__ = ["Rh3dgsDataParserConfig", "Rh3dgsDataParser", "read_seed_points"]


def read_seed_points(path: Union[str, Path]) -> Tuple[torch.Tensor, torch.Tensor]:
    """A point-cloud PLY -> ``(xyz [N, 3] float32, rgb [N, 3] uint8)``; rgb is ``[0, 3]`` without colours.

    Reads the ``vertex`` element's ``x y z`` (any float or int type) and, when present,
    ``red green blue`` (integer 0-255, or float 0-1 as some writers store them), ASCII or binary.
    A missing, truncated or non-PLY file, missing coordinates or a NaN / Inf coordinate raise
    :class:`~rh3dgs.errors.PlyFormatError` naming the file (and the property).
    """
    from plyfile import PlyData, PlyParseError

    path = Path(path)
    if not path.is_file():
        raise PlyFormatError(path, "seed point cloud not found (transforms.json's ply_file_path points here)")
    try:
        ply = PlyData.read(str(path))
    except PlyParseError as e:
        raise PlyFormatError(path, f"not a valid PLY point cloud, or truncated / corrupt: {e}") from e
    except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, EOFError, OverflowError, MemoryError) as e:
        raise PlyFormatError(path, f"not a valid PLY point cloud, or truncated / corrupt: {type(e).__name__}: {e}") from e
    except OSError as e:
        raise PlyFormatError(path, f"cannot read file: {e}") from e
    names = [e.name for e in ply.elements]
    if "vertex" not in names:
        raise PlyFormatError(path, f"no 'vertex' element (elements found: {', '.join(names) or 'none'})", field="vertex")
    v = ply["vertex"].data
    props = v.dtype.names or ()
    missing = [k for k in "xyz" if k not in props]
    if missing:
        raise PlyFormatError(path, f"missing point coordinates: {', '.join(missing)}", field="vertex")
    xyz = np.stack([np.asarray(v[k], dtype=np.float64) for k in "xyz"], -1)
    bad = ~np.isfinite(xyz).all(-1)
    if bad.any():
        raise PlyFormatError(path, f"{int(bad.sum())} point(s) with a NaN / Inf coordinate out of {len(xyz)}, "
                                   f"first at vertex {int(np.flatnonzero(bad)[0])}", field="vertex")
    if all(k in props for k in ("red", "green", "blue")):
        cols = np.stack([np.asarray(v[k]) for k in ("red", "green", "blue")], -1)
        if cols.dtype.kind == "f":
            cols = np.nan_to_num(cols, nan=0.0) * 255.0
        rgb = np.clip(np.round(cols), 0, 255).astype(np.uint8)
    else:
        rgb = np.zeros((0, 3), np.uint8)
    return torch.from_numpy(xyz.astype(np.float32)), torch.from_numpy(rgb)


SKIP_HINT = "`nerfstudio-data --skip-missing-images True` (after the method's options)"
"""How the missing-image error tells an ``ns-train`` user to leave those frames out."""


@dataclass
class Rh3dgsDataParserConfig(NerfstudioDataParserConfig):
    """nerfstudio-data's options on rh3dgs's image rule (missing images, downscale, undistortion: the module doc);
    seed points (``load_3D_points``, on by default) read with plyfile."""

    _target: Type = field(default_factory=lambda: Rh3dgsDataParser)
    load_3D_points: bool = True
    """Read transforms.json's ply_file_path as the seed point cloud (random seeds without one)."""
    skip_missing_images: bool = False
    """Leave out frames whose image file is missing (one warning), as rh3dgs extract --skip-missing-images."""
    image_cache_dir: Optional[Path] = None
    """Folder of the undistorted / resized images (default DATA/.rh3dgs_cache/images, or TEACHER_CACHE/images)."""


class Rh3dgsDataParser(Nerfstudio):
    """:class:`Nerfstudio` over :func:`rh3dgs.io.transforms.load_posed_images`' images, with :meth:`_load_3D_points`
    on plyfile (no open3d, no libusb)."""

    config: Rh3dgsDataParserConfig

    def _generate_dataparser_outputs(self, split="train"):
        """nerfstudio's outputs of the images rh3dgs sees: the dataset as it is when those are its own files at
        the chosen factor, else a derived transforms.json of the kept frames' processed images (module doc)."""
        posed, derived = self._images()
        if derived is None:
            return super()._generate_dataparser_outputs(split)
        data = self.config.data
        self.config.data = derived  # nerfstudio reads its file; every path in it is absolute
        try:
            return super()._generate_dataparser_outputs(split)
        finally:
            self.config.data = data

    def _images(self) -> Tuple[PosedImages, Optional[Path]]:
        """The posed images (made once per parser: train and eval splits share them) and the derived
        transforms.json nerfstudio reads instead of the dataset's (None: the dataset's own)."""
        if getattr(self, "_posed", None) is None:
            json_path = self.config.data if self.config.data.suffix == ".json" else self.config.data / "transforms.json"
            factor = self._factor(json_path)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                posed = load_posed_images(json_path, downscale=factor, skip_missing_images=self.config.skip_missing_images,
                                          image_cache=self.config.image_cache_dir, missing_hint=SKIP_HINT)
            for w in caught:
                CONSOLE.print(f"rh3dgs: warning: {w.message}", style="yellow", markup=False)
            own = list(posed.images) == posed.sources and len(posed.frames) == len(_frames(json_path))
            self.downscale_factor = factor if own else 1  # derived: the images are at their final size
            self._posed = posed
            self._derived = None if own else _derived_transforms(json_path, posed, self.config.image_cache_dir, factor)
        return self._posed, self._derived

    def _factor(self, json_path: Path) -> int:
        """``--downscale-factor``, or nerfstudio 1.1.5's automatic one (:func:`rh3dgs.io.transforms.nerfstudio_downscale`)."""
        factor = nerfstudio_downscale(json_path, self.config.downscale_factor)
        if self.config.downscale_factor is None and factor > 1:
            CONSOLE.log(f"Auto image downscale factor of {factor}")
        return factor

    def _load_3D_points(self, ply_file_path: Path, transform_matrix: torch.Tensor,
                        scale_factor: float) -> Optional[Dict[str, torch.Tensor]]:
        """Same contract as nerfstudio's: ``points3D_xyz`` in the normalised frame and
        ``points3D_rgb`` (uint8), or None for an empty cloud (the model then starts from random points)."""
        xyz, rgb = read_seed_points(ply_file_path)
        if xyz.shape[0] == 0:
            return None
        T = transform_matrix.to(torch.float32)
        pts = (torch.cat([xyz, torch.ones_like(xyz[:, :1])], -1) @ T.T) * scale_factor
        return {"points3D_xyz": pts, "points3D_rgb": rgb}


def _frames(json_path: Path) -> List[Any]:
    return json.loads(json_path.read_text(encoding="utf-8-sig"))["frames"]


_INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h")
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2", "distortion_params", "camera_model")
_PER_FRAME_FILES = ("mask_path", "depth_file_path")


def _derived_transforms(json_path: Path, posed: PosedImages, image_cache: Optional[Path], factor: int) -> Path:
    """The dataset's transforms.json for nerfstudio's parser with rh3dgs's images: the kept frames, each with its
    image (absolute path) and pinhole intrinsics, no distortion; seed points, splits and ``applied_transform``
    carried over. Written atomically beside the processed images; returns its path."""
    from ..io.images import default_image_cache

    meta = json.loads(json_path.read_text(encoding="utf-8-sig"))
    root = Path(os.path.abspath(json_path.parent))
    cams = posed.cameras
    frames, renamed = [], {}
    for j, i in enumerate(posed.frames):
        fr = {k: v for k, v in meta["frames"][i].items() if k not in _INTRINSICS + _DISTORTION}
        for key in _PER_FRAME_FILES:
            if key in fr:
                raise CameraFormatError(json_path, f"{key} with images rh3dgs undistorts, resizes or leaves out: masks "
                                                   "and depth maps are not resampled to match; undistort / downscale "
                                                   "them with the images first (images_N, masks_N folders)",
                                        field=f"frames[{i}].{key}")
        image = Path(os.path.abspath(posed.images[j]))
        renamed[str(meta["frames"][i]["file_path"])] = str(image)
        K = cams.Ks[j].double()
        fr.update(file_path=str(image), fl_x=float(K[0, 0]), fl_y=float(K[1, 1]), cx=float(K[0, 2]),
                  cy=float(K[1, 2]), w=int(cams.width), h=int(cams.height))
        frames.append(fr)
    out = {k: v for k, v in meta.items() if k not in _INTRINSICS + _DISTORTION + ("frames",)}
    if "ply_file_path" in out:
        out["ply_file_path"] = str(root / out["ply_file_path"])
    if "applied_transform" not in out and (root / "colmap" / "sparse" / "0").exists():
        out["applied_transform"] = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, -1, 0]]  # nerfstudio's COLMAP default
    for split in ("train", "val", "test"):
        key = f"{split}_filenames"
        if key in out:
            out[key] = [renamed[x] for x in out[key] if x in renamed]
    out["frames"] = frames
    cache = Path(image_cache) if image_cache is not None else default_image_cache(json_path)
    tag = hashlib.sha256(json.dumps([str(root / json_path.name), factor, posed.frames]).encode()).hexdigest()[:16]
    return atomic_save_json(cache / f"nerfstudio-{tag}.json", out, indent=1)
