"""``Rh3dgsDataParser``: nerfstudio's ``nerfstudio-data`` parser, seed points read with plyfile.

nerfstudio's :class:`~nerfstudio.data.dataparsers.nerfstudio_dataparser.Nerfstudio` parser reads
the seed point cloud (``ply_file_path`` in ``transforms.json``, written by ``ns-process-data``)
with open3d, and open3d cannot even be imported on a machine without ``libusb-1.0.so.0``. This
subclass changes only that step: the PLY is read with plyfile (already a dependency), then
nerfstudio's own transform is applied, so the points land in the same normalised frame as the
cameras::

    xyz_ns = (T @ [x, y, z, 1]^T) * s        T = dataparser_transform [3, 4], s = dataparser_scale

Cameras, splits, masks, depths and downscaling are nerfstudio's, unchanged. Both rh3dgs methods
(``ns-train rh3dgs`` / ``rh3dgs-lite``) use it, with ``load_3D_points=True``; on their command
line it is the default ``nerfstudio-data`` subcommand (tyro keeps the method's config instance,
so ``ns-train rh3dgs-lite nerfstudio-data --downscale-factor 2`` still reads with plyfile).

Example::

    >>> from rh3dgs.nerfstudio.dataparser import read_seed_points
    >>> xyz, rgb = read_seed_points("data/synth/sparse_pc.ply")     # doctest: +SKIP
    >>> xyz.shape, rgb.dtype                                          # doctest: +SKIP
    (torch.Size([4031, 3]), torch.uint8)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple, Type, Union

import numpy as np
import torch

from nerfstudio.data.dataparsers.nerfstudio_dataparser import Nerfstudio, NerfstudioDataParserConfig

from ..errors import PlyFormatError

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


@dataclass
class Rh3dgsDataParserConfig(NerfstudioDataParserConfig):
    """nerfstudio-data's options; seed points (``load_3D_points``, on by default) read with plyfile."""

    _target: Type = field(default_factory=lambda: Rh3dgsDataParser)
    load_3D_points: bool = True
    """Read transforms.json's ply_file_path as the seed point cloud (random seeds without one)."""


class Rh3dgsDataParser(Nerfstudio):
    """:class:`Nerfstudio` with :meth:`_load_3D_points` on plyfile (no open3d, no libusb)."""

    config: Rh3dgsDataParserConfig

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

