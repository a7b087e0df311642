"""Splat files as users have them: SuperSplat compressed PLY and Niantic SPZ, read through gsply.

Splat tools hand scenes around in two compact formats besides the INRIA PLY (:mod:`rh3dgs.io.ply`):

* **SuperSplat / PlayCanvas compressed PLY** (``*.compressed.ply``): a ``chunk`` element (per 256 splats, the
  min / max of positions, scales and colours), a ``vertex`` element of four packed ``uint`` (11-10-11-bit
  positions and scales, 2-10-10-10 smallest-three rotations, 8-bit RGBA) and an optional ``sh`` element of
  8-bit higher SH coefficients;
* **SPZ** (``*.spz``, Niantic): fixed-point positions, 8-bit alphas, colours, scales, rotations and SH, in one
  gzip stream (versions 1-3) or one zstd stream per attribute (version 4, ``NGSP`` header).

Both are decoded by gsply (:func:`gsply.plyread`, :func:`gsply.read_spz`; SPZ version 4 needs the
``zstandard`` package) into the same raw parameters as an INRIA PLY: means, log-scales, ``wxyz`` quaternions,
opacity logits, SH. SPZ stores its coordinates in the RUB frame (x right, y up, z back); PLY files, and
rh3dgs, use RDF (y down, z forward), so SPZ scenes are turned by ``diag(1, -1, -1)`` (a half turn about x):
``means * (1, -1, -1)``, ``q = (w, x, -y, -z)``, higher SH bands rotated
(:func:`rh3dgs.io.coordinate_frames.rotate_sh`). biker.spz then lines up with biker.compressed.ply to 1.2e-4.

The checks are those of our own PLYs: the header's row count goes through the memory model before anything
is decoded (and, for a PLY, against the file's size), and a decoded NaN / Inf in a mean, scale, rotation or
colour is refused, naming the file and the property; opacity may be +-inf (a saturated logit).

>>> from rh3dgs.io.ply import load_ply
>>> g = load_ply("biker.compressed.ply")      # doctest: +SKIP  (dispatches here)
>>> len(g), g.shN.shape[1]                     # doctest: +SKIP
(152746, 0)
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path
from typing import Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import InputFileError, PlyFormatError
from ..gaussians import Gaussians

__all__ = ["is_spz", "is_compressed_ply", "load_compressed_ply", "load_spz", "SPZ_TO_PLY"]

PathLike = Union[str, os.PathLike]

_SPZ_MAGIC = 0x5053474E  # "NGSP", little-endian
_GZIP_MAGIC = b"\x1f\x8b"
SPZ_TO_PLY = torch.diag(torch.tensor([1.0, -1.0, -1.0]))
"""SPZ's RUB axes -> the RDF axes of PLY files: a half turn about x."""


def is_spz(path: Path) -> bool:
    """Whether the file starts as an SPZ does (a gzip stream, or the ``NGSP`` magic of version 4)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head[:2] == _GZIP_MAGIC or (len(head) == 4 and struct.unpack("<I", head)[0] == _SPZ_MAGIC)


def is_compressed_ply(element_names: Sequence[str], vertex_properties: Sequence[str]) -> bool:
    """Whether a PLY header is SuperSplat's compressed layout (a ``chunk`` element, ``packed_*`` vertices)."""
    return "chunk" in element_names and "packed_position" in vertex_properties


def _check_decoded_size(path: Path, n: int, sh_coeffs: int) -> None:
    """The memory model before decoding ``n`` Gaussians with ``sh_coeffs`` higher SH coefficients per channel."""
    from ..memory import check_memory, ply_load_bytes

    check_memory(2 * ply_load_bytes(n, 14 + 3 * sh_coeffs), f"decoding {n} Gaussians from {path}",
                 detail="gsply's float32 arrays and the tensors made from them",
                 knobs=["fewer Gaussians (decimate the scene, e.g. `npx @playcanvas/splat-transform IN -d 50% OUT.ply`)"])


def _gaussians(path: Path, data, device) -> Gaussians:
    """gsply's GSData (PLY conventions) -> :class:`Gaussians`, every standard field checked finite."""
    n = int(data.means.shape[0])
    shN = data.shN if data.shN is not None else np.zeros((n, 0, 3), np.float32)
    fields = {"x y z": data.means, "scale_*": data.scales, "rot_*": data.quats, "f_dc_*": data.sh0,
              "f_rest_*": shN.reshape(n, -1)}
    for name, a in fields.items():
        bad = ~np.isfinite(a).reshape(n, -1).all(1)
        if bad.any():
            raise PlyFormatError(path, f"{int(bad.sum())} Gaussian(s) decode to NaN / Inf, first at {int(np.flatnonzero(bad)[0])}; "
                                       "the file is corrupt", field=name)
    opac = np.asarray(data.opacities, dtype=np.float32).reshape(n)
    if np.isnan(opac).any():
        raise PlyFormatError(path, f"{int(np.isnan(opac).sum())} NaN opacity value(s); the file is corrupt", field="opacity")

    def t(a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    g = Gaussians(means=t(data.means), scales=t(data.scales), quats=t(data.quats), opacities=t(opac),
                  sh0=t(data.sh0).reshape(n, 1, 3), shN=t(shN).reshape(n, -1, 3))
    return g if torch.device(device) == torch.device("cpu") else g.to(device)


def load_compressed_ply(path: PathLike, device: Union[str, torch.device] = "cpu", *, rows: int = -1,
                        sh_coeffs: int = 0) -> Gaussians:
    """A SuperSplat compressed PLY -> :class:`Gaussians` (raw parameters, as :func:`rh3dgs.io.ply.load_ply`).

    ``rows`` / ``sh_coeffs``: the header's vertex count and higher SH coefficients per channel, when the caller
    has parsed it (:func:`rh3dgs.io.ply.load_ply` has, and checked the rows against the file size); the memory
    model runs on them before gsply decodes anything. Raises :class:`PlyFormatError` naming the file.
    """
    import gsply

    path = Path(path)
    if rows >= 0:
        _check_decoded_size(path, rows, sh_coeffs)
    try:
        data = gsply.plyread(str(path))
    except (ValueError, KeyError, IndexError, TypeError, struct.error, OSError) as e:
        raise PlyFormatError(path, f"cannot decode the compressed (SuperSplat) PLY: {type(e).__name__}: {e}") from None
    if data is None or int(data.means.shape[0]) != rows >= 0:
        got = "nothing" if data is None else f"{int(data.means.shape[0])} Gaussians"
        raise PlyFormatError(path, f"the compressed PLY decodes to {got}, the header declares {rows}; truncated or corrupt")
    return _gaussians(path, data, device)


def _spz_header(path: Path) -> Tuple[int, int, int]:
    """``(version, points, sh_degree)`` from the header (the first 16 bytes of the gzip stream, or version 4's
    32 raw bytes), read before the payload is."""
    with open(path, "rb") as f:
        head = f.read(32)
    try:
        if head[:2] == _GZIP_MAGIC:
            with gzip.open(path, "rb") as z:
                head = z.read(16)
    except (OSError, EOFError, zlib.error) as e:
        raise PlyFormatError(path, f"not a readable SPZ file (gzip stream: {e})") from None
    if len(head) < 16 or struct.unpack_from("<I", head)[0] != _SPZ_MAGIC:
        raise PlyFormatError(path, "not an SPZ file (no NGSP header)")
    version, points = struct.unpack_from("<II", head, 4)
    sh_degree = head[12]
    if not 1 <= version <= 4:
        raise PlyFormatError(path, f"SPZ version {version}; versions 1 to 4 are known")
    if sh_degree > 3:
        raise PlyFormatError(path, f"SPZ header declares SH degree {sh_degree}; 0 to 3 are possible")
    return version, points, sh_degree


def load_spz(path: PathLike, device: Union[str, torch.device] = "cpu") -> Gaussians:
    """An SPZ file -> :class:`Gaussians` in the PLY (RDF) frame (module doc). Raises :class:`PlyFormatError`
    naming the file for a corrupt one, :class:`~rh3dgs.errors.InputFileError` when version 4 meets a machine
    without the ``zstandard`` package."""
    import gsply

    from .coordinate_frames import rotate_sh

    path = Path(path)
    version, points, sh_degree = _spz_header(path)
    _check_decoded_size(path, points, (sh_degree + 1) ** 2 - 1)
    try:
        data = gsply.read_spz(str(path))
    except ValueError as e:
        if "zstandard" in str(e):
            raise InputFileError(path, "is an SPZ version 4 file (zstd streams): reading it needs the zstandard "
                                       "package (pip install 'zstandard==0.25.0', in requirements.txt)") from None
        raise PlyFormatError(path, f"cannot decode the SPZ file: {e}") from None
    except (KeyError, IndexError, TypeError, struct.error, OSError, EOFError, zlib.error) as e:
        raise PlyFormatError(path, f"cannot decode the SPZ file: {type(e).__name__}: {e}") from None
    if int(data.means.shape[0]) != points:
        raise PlyFormatError(path, f"decodes to {int(data.means.shape[0])} Gaussians, the header declares {points}")
    g = _gaussians(path, data, "cpu")
    flip = torch.tensor([1.0, -1.0, -1.0])
    g = Gaussians(means=g.means * flip, scales=g.scales, quats=g.quats * torch.tensor([1.0, 1.0, -1.0, -1.0]),
                  opacities=g.opacities, sh0=g.sh0, shN=rotate_sh(g.shN, SPZ_TO_PLY).contiguous())
    return g if torch.device(device) == torch.device("cpu") else g.to(device)
