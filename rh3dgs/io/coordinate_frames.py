"""Coordinate frames of a scene: the dataset's, nerfstudio's normalised one, the capture's (COLMAP).

Gaussians and cameras come in one of three frames:

* ``data``: the frame of the dataset's ``transforms.json``, the cameras :func:`rh3dgs.load_transforms`
  reads. ``rh3dgs lift``, ``rh3dgs export`` and ``rh3dgs.load(config.yml)`` work in it.
* ``capture``: the frame before ``ns-process-data``'s ``applied_transform`` ``A`` (3 x 4, in
  ``transforms.json``; nerfstudio assumes ``[[0,1,0,0],[1,0,0,0],[0,0,-1,0]]`` when the field is
  missing and the dataset has ``colmap/sparse/0``): ``x_data = A [x_capture; 1]``. INRIA 3DGS and
  COLMAP PLYs are in it.
* ``nerfstudio``: ``ns-train``'s normalised frame, written by ``ns-export gaussian-splat``. The run
  folder's ``dataparser_transforms.json`` holds ``T`` (3 x 4) and ``s`` with
  ``x_ns = s T [x_capture; 1]`` (nerfstudio folds ``A`` into ``T``), so
  ``x_ns = s T A^-1 [x_data; 1]``.

A map between frames is a :class:`Similarity` ``x' = s R x + t``; :func:`transform_gaussians`
applies one to means, log-scales, rotations and the view-dependent SH coefficients.

:func:`to_data_frame` decides the frame of a user's PLY before a lift: it builds the candidate
maps from the files present (the ``dataparser_transforms.json`` next to the PLY or in a folder
above it, the dataset's ``applied_transform``) and scores each by where the Gaussians land in
the dataset's cameras (:func:`frame_fit`: the share of Gaussians inside a view frustum, times the
share of the image they cover). The PLY is mapped to the best candidate; when the PLY fits no
frame it is refused with one line naming the frame expected and how to get it.

>>> sim = nerfstudio_to_data("outputs/run/dataparser_transforms.json", "data/synth")  # doctest: +SKIP
>>> g_data = transform_gaussians(g_ns, sim)                                             # doctest: +SKIP
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cameras import Cameras
from ..errors import InputFileError
from ..gaussians import Gaussians
from ..memory import read_text_sized

__all__ = ["Similarity", "FrameError", "transform_gaussians", "transform_c2w", "read_dataparser_transforms",
           "applied_transform", "nerfstudio_to_data", "frame_fit", "photometric_error", "to_data_frame", "rotate_sh", "FRAMES",
           "DATAPARSER_TRANSFORMS", "COLMAP_APPLIED_TRANSFORM"]

PathLike = Union[str, os.PathLike]
FRAMES = ("auto", "data", "nerfstudio", "capture")
DATAPARSER_TRANSFORMS = "dataparser_transforms.json"
#: what nerfstudio assumes for a COLMAP dataset whose transforms.json has no "applied_transform"
COLMAP_APPLIED_TRANSFORM = ((0.0, 1.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, -1.0, 0.0))
#: a frame fits when its score (frame_fit) is at least this, and a candidate replaces the data frame
#: only when it scores FIT_MARGIN times better
MIN_FIT, FIT_MARGIN = 0.2, 1.5


class FrameError(InputFileError):
    """Gaussians that are in no frame the dataset's cameras see, or a frame file that cannot be used."""


@dataclass(frozen=True)
class Similarity:
    """``x' = s R x + t``: R [3, 3] rotation (float64), t [3], s > 0."""

    R: Tensor
    t: Tensor
    s: float = 1.0

    @staticmethod
    def identity() -> "Similarity":
        return Similarity(torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 1.0)

    @staticmethod
    def from_matrix(M, scale: float = 1.0, source: Optional[PathLike] = None, field: Optional[str] = None) -> "Similarity":
        """From a 3 x 4 (or 4 x 4) ``[s' R | t]`` times ``scale``; a reflection or shear raises FrameError."""
        M = torch.as_tensor(M, dtype=torch.float64)
        if M.shape not in ((3, 4), (4, 4)) or not torch.isfinite(M).all() or not scale > 0:
            raise FrameError(source, f"expected a finite 3x4 transform and a positive scale, got shape "
                                     f"{list(M.shape)} and scale {scale}", field=field)
        A, t = M[:3, :3], M[:3, 3]
        det = float(torch.linalg.det(A))
        if det <= 0:
            raise FrameError(source, f"the transform is not a rotation (determinant {det:.3g})", field=field)
        k = det ** (1 / 3)
        R = A / k
        if (R.T @ R - torch.eye(3, dtype=torch.float64)).abs().max() > 1e-4:
            raise FrameError(source, "the transform is not a rotation times a scale (it shears)", field=field)
        return Similarity(R, t * scale, k * scale)

    def __matmul__(self, other: "Similarity") -> "Similarity":
        """``(self @ other)(x) = self(other(x))``."""
        return Similarity(self.R @ other.R, self.s * (self.R @ other.t) + self.t, self.s * other.s)

    def inverse(self) -> "Similarity":
        Rt = self.R.T
        return Similarity(Rt, -(Rt @ self.t) / self.s, 1.0 / self.s)

    def apply(self, x: Tensor) -> Tensor:
        """[..., 3] points."""
        return (self.s * (x.double() @ self.R.T) + self.t).to(x.dtype)

    def is_identity(self, tol: float = 1e-9) -> bool:
        return bool((self.R - torch.eye(3, dtype=torch.float64)).abs().max() < tol and self.t.abs().max() < tol
                    and abs(self.s - 1) < tol)


def _quat_from_rotmat(R: Tensor) -> Tensor:
    """[3, 3] rotation -> (w, x, y, z) unit quaternion (float64)."""
    m = R.double()
    t = m.trace()
    if t > 0:
        s = math.sqrt(float(t) + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + float(m[0, 0] - m[1, 1] - m[2, 2])) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + float(m[1, 1] - m[0, 0] - m[2, 2])) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + float(m[2, 2] - m[0, 0] - m[1, 1])) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = torch.tensor([float(x) for x in q], dtype=torch.float64)
    return q / q.norm()


def _quat_mul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b, (w, x, y, z); a [4] or [N, 4], b [N, 4]."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz,
                        aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw], -1)


def rotate_sh(shN: Tensor, R: Tensor, n_dirs: int = 256) -> Tensor:
    """Rotate higher SH coefficients [N, K, 3] (gsplat's basis) for a world rotation R [3, 3].

    The new coefficients c' satisfy ``color'(R d) = color(d)`` for every direction d; found per
    band by least squares on ``n_dirs`` directions (exact: rotations do not mix bands).
    """
    K = shN.shape[1]
    if K == 0:
        return shN
    from ..ops._gsplat import eval_sh_bases

    gen = torch.Generator().manual_seed(0)
    X = F.normalize(torch.randn(n_dirs, 3, generator=gen, dtype=torch.float64), dim=-1)
    R = R.double()
    Y = eval_sh_bases(K + 1, X.float()).double()[:, 1:]  # Y(d)      [M, K]
    Yr = eval_sh_bases(K + 1, (X @ R.T).float()).double()[:, 1:]  # Y(R d) [M, K]
    # color'(R d) = Yr c' = Y c  ->  c' = pinv(Yr) Y c
    M = torch.linalg.lstsq(Yr, Y).solution  # [K, K]
    return torch.einsum("kj,njc->nkc", M.to(shN.dtype), shN)


def transform_gaussians(g: Gaussians, sim: Similarity) -> Gaussians:
    """The Gaussians ``g`` mapped by ``sim``: means ``s R x + t``, log-scales ``+ log s``, rotations
    ``q(R) q``, SH bands rotated (:func:`rotate_sh`); opacities, colours, latents and extra fields kept."""
    if sim.is_identity():
        return g
    dev = g.means.device
    means = sim.apply(g.means.detach().cpu()).to(dev)
    scales = g.scales + math.log(sim.s)
    qR = _quat_from_rotmat(sim.R).to(g.quats)
    quats = _quat_mul(qR[None], F.normalize(g.quats, dim=-1))
    shN = rotate_sh(g.shN.detach().cpu(), sim.R).to(g.shN)
    return Gaussians(means=means.contiguous(), scales=scales.contiguous(), quats=quats.contiguous(),
                     opacities=g.opacities, sh0=g.sh0, shN=shN.contiguous(), latents=g.latents, extra=dict(g.extra))


def transform_c2w(c2w: Tensor, sim: Similarity) -> Tensor:
    """[B, 4, 4] camera-to-world matrices mapped by ``sim`` (rotation ``R R_c``, centre ``s R p + t``)."""
    out = c2w.double().clone()
    out[:, :3, :3] = sim.R @ out[:, :3, :3]
    out[:, :3, 3] = sim.apply(out[:, :3, 3])
    return out.to(c2w.dtype)


# ------------------------------------------------------------------------- the frame files
def read_dataparser_transforms(path: PathLike) -> Similarity:
    """``dataparser_transforms.json`` (``{"transform": 3x4, "scale": s}``) -> the map capture -> nerfstudio."""
    path = Path(path)
    try:
        meta = json.loads(read_text_sized(path, "a dataparser transform"))
        T = torch.tensor(meta["transform"], dtype=torch.float64).reshape(3, 4)
        scale = float(meta["scale"])
    except (OSError, ValueError, RecursionError, KeyError, TypeError, RuntimeError) as exc:
        raise FrameError(path, f"not a nerfstudio dataparser transform ({{'transform': 3x4, 'scale': float}}): "
                               f"{type(exc).__name__}: {exc}") from None
    return Similarity.from_matrix(T, scale, source=path, field="transform")


def applied_transform(data_dir: Optional[PathLike]) -> Similarity:
    """The map capture -> data of a dataset folder (its transforms.json's ``applied_transform``,
    nerfstudio's COLMAP default where the field is missing and ``colmap/sparse/0`` exists, else identity)."""
    if data_dir is None:
        return Similarity.identity()
    data_dir = Path(data_dir)
    tj = data_dir / "transforms.json" if data_dir.is_dir() or data_dir.suffix != ".json" else data_dir
    root = tj.parent
    try:
        meta = json.loads(read_text_sized(tj, "a transforms.json")) if tj.is_file() else {}
    except (OSError, ValueError, RecursionError):
        meta = {}  # transforms.json's own reader reports it
    A = meta.get("applied_transform") if isinstance(meta, dict) else None
    if A is None and (root / "colmap" / "sparse" / "0").exists():
        A = COLMAP_APPLIED_TRANSFORM
    if A is None:
        return Similarity.identity()
    try:
        return Similarity.from_matrix(A, 1.0, source=tj, field="applied_transform")
    except (TypeError, ValueError, RuntimeError) as exc:
        raise FrameError(tj, f"cannot be read as a 3x4 matrix ({exc})", field="applied_transform") from None


def nerfstudio_to_data(dataparser_transforms: PathLike, data_dir: Optional[PathLike]) -> Similarity:
    """The map nerfstudio frame -> data frame: ``A (s T)^-1`` (module docstring)."""
    return applied_transform(data_dir) @ read_dataparser_transforms(dataparser_transforms).inverse()


def _find_dataparser_transforms(ply: Path, levels: int = 4) -> Optional[Path]:
    """``dataparser_transforms.json`` next to the PLY or in one of the ``levels`` folders above it."""
    folder = ply.absolute().parent
    for _ in range(levels + 1):
        cand = folder / DATAPARSER_TRANSFORMS
        if cand.is_file():
            return cand
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


# ------------------------------------------------------------------------- detection
def frame_fit(means: Tensor, cameras: Cameras, grid: int = 8, max_points: int = 200_000) -> Tuple[float, float]:
    """How well points [N, 3] sit in the cameras: ``(inside, coverage)``.

    ``inside``: the share of points in front of at least one camera and projecting into its image;
    ``coverage``: the share of the cells of a ``grid x grid`` partition of the images (over all views)
    hit by at least one of them. A scene in the cameras' frame fills their images (coverage ~0.6 on
    the synthetic scene, ~1 for a captured one); the same scene in nerfstudio's normalised frame
    is a patch (0.13 on the synthetic scene), although every Gaussian is still inside a frustum.
    """
    x = means.detach().float().cpu()
    if x.shape[0] > max_points:
        x = x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:max_points]]
    x = x[torch.isfinite(x).all(-1)]
    if x.shape[0] == 0 or len(cameras) == 0:
        return 0.0, 0.0
    xh = torch.cat([x, torch.ones(x.shape[0], 1)], 1)
    inside = torch.zeros(x.shape[0], dtype=torch.bool)
    cells = torch.zeros(len(cameras), grid * grid, dtype=torch.bool)
    W, H = cameras.width, cameras.height
    for i in range(len(cameras)):
        pc = xh @ cameras.viewmats[i].float().cpu().T
        z = pc[:, 2]
        K = cameras.Ks[i].float().cpu()
        u = pc[:, 0] / z.clamp_min(1e-9) * K[0, 0] + K[0, 2]
        v = pc[:, 1] / z.clamp_min(1e-9) * K[1, 1] + K[1, 2]
        ok = (z > 1e-6) & (u >= 0) & (u < W) & (v >= 0) & (v < H)
        inside |= ok
        gx = (u[ok] / W * grid).long().clamp(0, grid - 1)
        gy = (v[ok] / H * grid).long().clamp(0, grid - 1)
        cells[i, gy * grid + gx] = True
    return float(inside.float().mean()), float(cells.float().mean())


def _score(means: Tensor, cameras: Cameras) -> float:
    inside, coverage = frame_fit(means, cameras)
    return inside * coverage


def photometric_error(g: Gaussians, cameras: Cameras, images: Sequence[PathLike], views: int = 4,
                      max_side: int = 64) -> Optional[float]:
    """Mean absolute RGB error of ``g`` rendered through up to ``views`` of the cameras (at most
    ``max_side`` pixels wide) against the dataset's images; None when the images cannot be read."""
    import numpy as np
    from PIL import Image

    from ..errors import Rh3dgsError
    from ..rendering import render
    from .images import open_image

    idx = sorted({round(i * (len(cameras) - 1) / max(1, views - 1)) for i in range(min(views, len(cameras)))})
    f = min(1.0, max_side / max(cameras.width, cameras.height))
    w, h = max(1, round(cameras.width * f)), max(1, round(cameras.height * f))
    errs = []
    for i in idx:
        try:
            with open_image(images[i]) as im:  # sized before decoding
                ref = torch.from_numpy(np.asarray(im.convert("RGB").resize((w, h), Image.BILINEAR)).copy()).float() / 255
        except (Rh3dgsError, IndexError):  # unreadable, or too large to decode: no score
            return None
        K = cameras.Ks[i:i + 1].clone()
        K[:, 0] *= w / cameras.width
        K[:, 1] *= h / cameras.height
        cam = Cameras(cameras.viewmats[i:i + 1], K, w, h)
        with torch.no_grad():
            rgb = render(g, cam.to(g.means.device)).rgb[0].float().cpu().clamp(0, 1)
        errs.append(float((rgb - ref).abs().mean()))
    return sum(errs) / len(errs) if errs else None


def to_data_frame(gaussians: Gaussians, ply: PathLike, cameras: Cameras, data_dir: Optional[PathLike],
                  frame: Literal["auto", "data", "nerfstudio", "capture"] = "auto",
                  dataparser_transforms: Optional[PathLike] = None,
                  images: Optional[Sequence[PathLike]] = None) -> Tuple[Gaussians, str]:
    """The PLY's Gaussians in the frame of the dataset's cameras, and the frame they were found in.

    ``frame="auto"`` scores the data frame and every candidate the files allow (module docstring)
    and keeps the best: by :func:`frame_fit`, and where ``images`` (the cameras' image files) are
    given and more than one candidate fits, by :func:`photometric_error` (geometry alone cannot tell
    a scene from its mirror image: ``applied_transform`` swaps two axes and flips the third); ``"data"`` trusts the PLY as it is; ``"nerfstudio"`` / ``"capture"`` force
    that map (``nerfstudio`` needs a ``dataparser_transforms.json``: next to the PLY, in a folder above
    it, or ``dataparser_transforms``). Raises :class:`FrameError` (one line, naming the PLY, the frame
    expected and how to get it) when no frame fits.
    """
    ply = Path(ply)
    if frame not in FRAMES:
        raise FrameError(ply, f"unknown frame {frame!r} (choose one of {', '.join(FRAMES)})")
    if frame == "data":
        return gaussians, "data"
    dp = Path(dataparser_transforms) if dataparser_transforms is not None else _find_dataparser_transforms(ply)
    cands: List[Tuple[str, Similarity]] = [("data", Similarity.identity())]
    A = applied_transform(data_dir)
    if not A.is_identity():
        cands.append(("capture", A))
    if dp is not None:
        cands.append(("nerfstudio", A @ read_dataparser_transforms(dp).inverse()))
    if frame != "auto":
        chosen = dict(cands).get(frame)
        if chosen is None:
            need = (f"a {DATAPARSER_TRANSFORMS} (the ns-train run's) next to the PLY" if frame == "nerfstudio"
                    else f"an applied_transform in {Path(data_dir or '.') / 'transforms.json'}")
            raise FrameError(ply, f"frame {frame!r} needs {need}")
        return transform_gaussians(gaussians, chosen), frame
    means = gaussians.means.detach().cpu().double()
    scores = {name: _score(sim.apply(means).float(), cameras) for name, sim in cands}
    best = max(scores, key=scores.get)
    if best != "data" and scores[best] < FIT_MARGIN * scores["data"]:
        best = "data"  # a candidate must beat the PLY as it is clearly
    fitting = [name for name, sim in cands if scores[name] >= MIN_FIT]
    if images is not None and len(fitting) > 1:
        errors = {name: photometric_error(transform_gaussians(gaussians, dict(cands)[name]), cameras, images)
                  for name in fitting}
        if all(e is not None for e in errors.values()):
            best = min(errors, key=errors.get)
    if scores[best] >= MIN_FIT:
        return transform_gaussians(gaussians, dict(cands)[best]), best
    tried = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    raise FrameError(ply, f"the Gaussians do not sit in the cameras of {Path(data_dir or '.') / 'transforms.json'} "
                          f"(fit {tried}; {MIN_FIT} needed): a lift needs the dataset's frame. A PLY from "
                          f"`ns-export gaussian-splat` is in nerfstudio's normalised frame: put the run's "
                          f"{DATAPARSER_TRANSFORMS} next to it, or write it with `rh3dgs export "
                          f"outputs/.../config.yml --output scene.ply` (keeps the dataset frame); --frame data takes it as it is")
