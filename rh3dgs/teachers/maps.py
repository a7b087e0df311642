"""Teacher maps: the per-view 2D feature maps every consumer (lift, distillation, training) reads.

A *teacher map* is one view's dense teacher output ``[h, w, D]`` at any resolution (usually the
teacher's patch grid). Consumers need it at the render's resolution ``[H, W, D]``, float32, with
unit rows; zero rows mean "no feature here" and are ignored downstream. This module is the one
place that checks, resizes and renormalises a map:

    prepare_map(m, (H, W))  =  normalize( bilinear_{align_corners=False}(m, H, W) )   (zero rows stay zero)

A collection of maps for B views is a :data:`TeacherMaps`: a ``[B, h, w, D]`` tensor, a sequence
of ``[h, w, D]`` maps, or a callable ``i -> [h, w, D]`` that streams them (e.g. from the feature
cache), so that nothing needs all maps in memory at once.

It is also the one provider ``dataset -> per-view maps``, :func:`dataset_maps`, used by
``rh3dgs extract`` / ``rh3dgs lift`` and the nerfstudio data manager alike: a teacher whose maps
are files already (``precomputed``, :meth:`~rh3dgs.teachers.base.Teacher.map_files`) is read in
place; any other is run once per image into the on-disk feature cache
(:func:`rh3dgs.teachers.cache.extract_features`), whose one default location is
``<data>/.rh3dgs_cache`` (:func:`default_cache_dir`), so every entry point reuses what another
computed.

>>> import torch
>>> from rh3dgs.teachers.maps import prepare_map
>>> m = torch.randn(4, 4, 8)                      # a 4x4 patch grid of 8-d features
>>> prepare_map(m, (16, 16)).shape
torch.Size([16, 16, 8])
"""
from __future__ import annotations

import collections.abc
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError, NonFiniteError, ShapeError
from ..ops import guided_upsample  # noqa: F401  (the teacher maps' guided upsampling, a native op: rh3dgs.ops)
from .cache import extract_features, read_stored_map

__all__ = ["TeacherMaps", "get_map", "map_dim", "principal_basis", "ProjectedMaps", "prepare_map", "prepare_maps", "guided_upsample", "constant_regions", "region_fraction", "upsample_features", "load_cached",
           "DEFAULT_CACHE_DIRNAME", "default_cache_dir", "DatasetMaps", "dataset_maps"]

PathLike = Union[str, Path]

#: B per-view maps: a [B, h, w, D] tensor, a sequence of [h, w, D] maps, or a callable i -> [h, w, D].
TeacherMaps = Union[Tensor, Sequence[Tensor], Callable[[int], Tensor]]


def get_map(teacher_maps: TeacherMaps, i: int) -> Tensor:
    """Map of view ``i`` as given (no copy, no check)."""
    m = teacher_maps(i) if callable(teacher_maps) else teacher_maps[i]
    return torch.as_tensor(m)


def map_dim(teacher_maps: TeacherMaps) -> int:
    """Teacher dimension D (reads view 0)."""
    return int(get_map(teacher_maps, 0).shape[-1])


def principal_basis(teacher_maps: TeacherMaps, k: int, views: int, max_rows: int = 16384,
                    max_views: int = 64) -> Tensor:
    """``[D, k]`` orthonormal columns: the top-``k`` uncentred principal directions of the maps' unit rows.

    ``C = sum_p z_p z_p^T`` over a sample of the non-zero, finite unit rows ``z_p`` (up to ``max_rows``,
    spread evenly over up to ``max_views`` of the ``views`` maps, each read at its own resolution);
    the basis is C's top-``k`` eigenvectors, each column's largest entry made positive (deterministic).
    Uncentred, as the lift's PCA decoder: the common direction of CLIP-like features is the first one.

    >>> import torch
    >>> m = torch.zeros(4, 4, 8); m[..., 0] = 1.0; m[:2, :, 1] = 1.0   # rows in span(e0, e1)
    >>> P = principal_basis([m], 2, views=1)
    >>> bool(torch.allclose(P.T @ P, torch.eye(2), atol=1e-5)), float(P[2:].abs().max()) < 1e-6
    (True, True)
    """
    idx = sorted({round(i * (views - 1) / max(1, max_views - 1)) for i in range(min(views, max_views))})
    per = max(1, max_rows // max(1, len(idx)))
    C = None
    for i in idx:  # each map read once (view 0 first: its channels are D)
        m = get_map(teacher_maps, i)
        D = int(m.shape[-1]) if C is None else C.shape[0]
        z = m.detach().float().cpu().reshape(-1, D)
        n = torch.linalg.vector_norm(z, dim=-1)
        z = z[torch.isfinite(z).all(-1) & (n > 1e-8)]
        z = z[:: max(1, z.shape[0] // per)][:per]
        z = z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)
        C = (z.T @ z).double() if C is None else C + (z.T @ z).double()
    evals, evecs = torch.linalg.eigh(C)
    basis = evecs[:, torch.argsort(evals, descending=True)[: min(k, D)]].float()
    sign = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    return basis * torch.where(sign == 0, torch.ones_like(sign), sign)


class ProjectedMaps(collections.abc.Sequence):
    """``B`` teacher maps seen through a basis ``[D, k]``: map ``i`` is ``get_map(maps, i) @ basis``
    (``[h, w, k]``; zero rows stay zero, NaN / Inf stay where they were for :func:`prepare_map` to name).
    The lift's principal subspace (``LiftConfig.subspace``).

    >>> import torch
    >>> maps = torch.randn(2, 3, 3, 8); P = torch.linalg.qr(torch.randn(8, 4))[0]
    >>> ProjectedMaps(maps, P, 2)[1].shape
    torch.Size([3, 3, 4])
    """

    def __init__(self, teacher_maps: TeacherMaps, basis: Tensor, views: int):
        self.maps, self.basis, self.views = teacher_maps, basis, int(views)

    def __len__(self) -> int:
        return self.views

    def __getitem__(self, i):  # type: ignore[override]
        if not isinstance(i, int):
            raise TypeError("ProjectedMaps takes one view index")
        m = get_map(self.maps, i)
        D = self.basis.shape[0]
        if m.shape[-1] != D:
            raise ShapeError(f"teacher map of view {i} has {m.shape[-1]} channels, view 0 has {D}")
        return m.float() @ self.basis.to(m.device)


def prepare_map(m: Tensor, size: Tuple[int, int], view: Optional[int] = None) -> Tensor:
    """One view's map ``[h, w, D]`` -> ``[H, W, D]`` float32 unit rows (bilinear if the size differs).

    Raises :class:`ShapeError` for a map that is not 3-D and :class:`NonFiniteError` for NaN / Inf
    (checked before resizing: bilinear weights keep finite values finite). The input is never
    modified. Rows whose norm is below 1e-8 (ignored pixels) stay exactly zero.
    """
    where = "teacher map" if view is None else f"teacher map of view {view}"
    if m.dim() != 3:
        raise ShapeError(f"{where} must be [h, w, D], got {list(m.shape)}")
    H, W = int(size[0]), int(size[1])
    if H <= 0 or W <= 0:
        raise ShapeError(f"{where}: output size must be positive, got {tuple(size)}")
    m = m.float()
    if not torch.isfinite(m).all():
        raise NonFiniteError(f"{where} contains NaN / Inf")
    if m.shape[:2] != (H, W):
        # channels-last in and out: the [H, W, D] result needs no permuting copy
        x = m.permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
        m = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
        m = m.contiguous()  # a view of channels-last memory: no copy
    else:
        m = m.clone()  # normalised in place below; the caller's map stays as it was
    n = torch.linalg.vector_norm(m, dim=-1, keepdim=True)
    return m.mul_(torch.where(n > 1e-8, 1.0 / n.clamp_min(1e-8), 0.0))  # unit rows, zero rows stay zero


def _region_ids(x: Tensor) -> "np.ndarray":
    """[B, h, w, D] maps (CPU) -> [B, h, w] int64 ids of their :func:`constant_regions` regions, all views in one
    ``connected_components`` call on their joint graph: ids consecutive over the views (a view's regions take
    a run of them, in scan order), -1 on zero rows."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    B, h, w = (int(n) for n in x.shape[:3])
    nz = (torch.linalg.vector_norm(x, dim=-1) > 1e-8).numpy().reshape(-1)
    idx = np.arange(B * h * w).reshape(B, h, w)
    src, dst = [], []
    for a, b, sa, sb in ((x[:, :, :-1], x[:, :, 1:], idx[:, :, :-1], idx[:, :, 1:]),
                         (x[:, :-1], x[:, 1:], idx[:, :-1], idx[:, 1:])):
        same = (a == b).all(-1).numpy()
        src.append(sa[same]), dst.append(sb[same])
    src, dst = np.concatenate(src), np.concatenate(dst)
    keep = nz[src]  # zero rows: no region (equal zero neighbours are not joined)
    n = B * h * w
    graph = coo_matrix((np.ones(int(keep.sum()), dtype=np.int8), (src[keep], dst[keep])), shape=(n, n))
    # scipy labels components in the order of their first node: scan order, view after view
    _, labels = connected_components(graph, directed=False)
    labels = np.where(nz, labels, -1)
    _, ids = np.unique(labels, return_inverse=True)  # consecutive ids; -1 sorts first
    return ids.reshape(B, h, w) - (1 if (~nz).any() else 0)


def _per_pixel_of_maps(m: Union[Tensor, Sequence[Tensor]], size: Optional[Tuple[int, int]],
               fn: Callable[[Tensor], Tensor]) -> Tensor:
    """A per-pixel quantity of teacher maps: ``fn`` ([B, h, w, D] float CPU maps -> [B, h, w]) of one map
    ``[h, w, D]`` (-> ``[h, w]``), a ``[B, h, w, D]`` tensor or a sequence of maps (-> ``[B, h, w]``; equal-sized
    maps in one call, others one by one), resized to ``size`` by nearest neighbour, on the maps' device."""
    if isinstance(m, (list, tuple)) or m.dim() == 4:
        if isinstance(m, Tensor) or all(x.dim() == 3 and x.shape == m[0].shape for x in m):
            batch = m if isinstance(m, Tensor) else torch.stack(list(m))
            return _resize_nearest(fn(batch.detach().float().cpu()), size).to(batch.device)
        return torch.stack([_per_pixel_of_maps(x, size, fn) for x in m])
    if m.dim() != 3:
        raise ShapeError(f"teacher map must be [h, w, D], got {list(m.shape)}")
    return _per_pixel_of_maps(m[None], size, fn)[0]


def constant_regions(m: Union[Tensor, Sequence[Tensor]], size: Optional[Tuple[int, int]] = None) -> Tensor:
    """Region ids ``[h, w]`` int64 of a map: 4-connected sets of pixels whose rows are exactly equal; -1 on zero rows.

    A mask teacher (SAM + CLIP: one embedding per mask) gives piecewise-constant maps, and a region is
    one of its masks as the teacher (or its cache) holds it; in a dense teacher's map (patch tokens) every
    cell is its own region. Ids are ``0 .. R-1`` in scan order (scipy's ``connected_components``). A
    ``[B, h, w, D]`` tensor or a sequence of maps gives ``[B, h, w]`` (ids per view). ``size``: resized to
    ``(H, W)`` by nearest neighbour (the grid the map is compared at).

    >>> import torch
    >>> m = torch.zeros(2, 4, 3); m[:, :3, 0] = 1.0; m[1, 3, 1] = 1.0   # a 2x3 region, a zero row, a 1x1 region
    >>> constant_regions(m)
    tensor([[ 0,  0,  0, -1],
            [ 0,  0,  0,  1]])
    """
    import numpy as np

    def ids_per_view(x: Tensor) -> Tensor:
        ids = _region_ids(x)
        if ids.size:  # each view's ids from 0: its run of the joint ids starts at its smallest
            nz = ids >= 0
            first = np.where(nz, ids, np.iinfo(np.int64).max).reshape(len(ids), -1).min(1)
            first = np.where(nz.reshape(len(ids), -1).any(1), first, 0)  # a view without feature: all -1
            ids = np.where(nz, ids - first[:, None, None], -1)
        return torch.from_numpy(ids.astype(np.int64))

    return _per_pixel_of_maps(m, size, ids_per_view)


def region_fraction(m: Union[Tensor, Sequence[Tensor]], size: Optional[Tuple[int, int]] = None) -> Tensor:
    """Per pixel, the share of the map covered by its :func:`constant_regions` region: ``[h, w]`` in [0, 1].

    Resolution-free (a region's pixel count over ``h w``): a mask teacher's mask covers the same share at
    any resolution; in a dense teacher's map every pixel gets ``1 / (h w)``. Zero rows (no feature) get 0.
    ``[B, h, w, D]`` or a sequence of maps give ``[B, h, w]`` (one graph for all equal-sized maps);
    ``size``: resized by nearest neighbour.

    >>> import torch
    >>> m = torch.zeros(2, 4, 3); m[:, :3, 0] = 1.0; m[:, 3, 1] = 1.0   # a 2x3 region and a 2x1 region
    >>> region_fraction(m)
    tensor([[0.7500, 0.7500, 0.7500, 0.2500],
            [0.7500, 0.7500, 0.7500, 0.2500]])
    """
    def fractions(x: Tensor) -> Tensor:
        ids = torch.from_numpy(_region_ids(x))
        ok = ids >= 0
        counts = torch.bincount(ids[ok], minlength=1).double()  # regions never span views: per-view sizes
        frac = torch.zeros(ids.shape, dtype=torch.float64)
        frac[ok] = counts[ids[ok]] / float(ids.shape[1] * ids.shape[2])
        return frac.float()

    return _per_pixel_of_maps(m, size, fractions)


def _resize_nearest(x: Tensor, size: Optional[Tuple[int, int]]) -> Tensor:
    """[B, h, w] -> [B, H, W] by nearest neighbour (ids or fractions: no value is blended); None / same size: as is."""
    if size is None or tuple(size) == tuple(x.shape[-2:]):
        return x
    return F.interpolate(x[:, None].double(), size=tuple(int(s) for s in size), mode="nearest")[:, 0].to(x.dtype)


def prepare_maps(teacher_maps: TeacherMaps, views: Sequence[int], size: Tuple[int, int],
                 device: Union[str, torch.device, None] = None) -> Tensor:
    """:func:`prepare_map` of each of ``views`` -> ``[len(views), H, W, D]`` on ``device``."""
    out = torch.stack([prepare_map(get_map(teacher_maps, i), size, i) for i in views])
    return out if device is None else out.to(device)


def upsample_features(fmap: Tensor, out_size: Optional[Tuple[int, int]] = None) -> Tensor:
    """:func:`prepare_map` at ``out_size = (H, W)``, or at the map's own size when ``None``.

    Bilinear, ``align_corners=False`` (pixel centres, like image resizing); each output vector is
    L2-normalised again (interpolating unit vectors shrinks them). Returns float32.
    """
    return prepare_map(fmap, tuple(fmap.shape[:2]) if out_size is None else out_size)


def load_cached(path: PathLike, out_size: Optional[Tuple[int, int]] = None) -> Tensor:
    """A feature-cache entry ready for use -> ``[H, W, D]`` float32 unit vectors (the stored map,
    :func:`rh3dgs.teachers.cache.read_stored_map`, renormalised).

    With ``out_size = (H, W)`` the map is bilinearly upsampled to the image size and
    renormalised; otherwise it is returned at the teacher's resolution.
    """
    return upsample_features(read_stored_map(path), out_size)


# ------------------------------------------------------------------------------ the provider
DEFAULT_CACHE_DIRNAME = ".rh3dgs_cache"
"""Name of the feature cache folder inside a dataset folder: the default of every entry point."""


def default_cache_dir(data_dir: PathLike) -> Path:
    """``<data_dir>/.rh3dgs_cache``: where teacher features are cached unless a cache folder is given."""
    return Path(data_dir) / DEFAULT_CACHE_DIRNAME


class DatasetMaps(collections.abc.Sequence):
    """Per-view teacher maps of a dataset's images (a :data:`TeacherMaps` sequence, read on access).

    ``maps[i]`` -> ``[h, w, D]`` unit float32 on CPU at the teacher's resolution; ``files[i]`` is
    the file it is read from (a feature-cache entry when ``cached``, else the teacher's own map);
    ``stats`` counts ``images`` and the cache's ``computed`` / ``reused`` / ``invalid`` entries
    (0 computed when read in place).
    """

    def __init__(self, teacher: Any, files: List[Path], cached: bool, stats: Dict[str, Any]) -> None:
        self.teacher, self.files, self.cached, self.stats = teacher, files, cached, stats

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Tensor:  # type: ignore[override]
        path = self.files[i]
        return load_cached(path) if self.cached else self.teacher.features_for_path(path)

    def __repr__(self) -> str:
        return f"DatasetMaps({self.teacher.name}, {len(self)} views, cached={self.cached})"


def dataset_maps(teacher: Any, image_paths: Sequence[PathLike], cache_dir: Optional[PathLike] = None, *,
                 data_dir: Optional[PathLike] = None, progress: bool = True, distributed: bool = False) -> DatasetMaps:
    """The teacher maps of ``image_paths`` (the provider every entry point uses).

    Args:
        teacher: a :class:`~rh3dgs.teachers.base.Teacher`.
        image_paths: the dataset's images, in view order.
        cache_dir: root of the feature cache; default :func:`default_cache_dir` of ``data_dir``.
        data_dir: the dataset folder (for the default cache folder).
        progress: progress bar while features are computed.
        distributed: compute the missing entries data-parallel over the initialised
            ``torch.distributed`` group (collective; see :mod:`rh3dgs.teachers.cache`).

    A teacher with :meth:`~rh3dgs.teachers.base.Teacher.map_files` (``precomputed``) is read in
    place: nothing is computed or cached. Any other computes only the entries its cache lacks.
    """
    images = [Path(p) for p in image_paths]
    files = teacher.map_files(images)
    if files is not None:
        return DatasetMaps(teacher, list(files), False, {"images": len(images), "computed": 0, "reused": 0,
                                                          "invalid": 0})
    if cache_dir is None:
        if data_dir is None:
            raise ConfigError(f"teacher {teacher.name!r}: give the feature cache folder or the dataset folder "
                              f"(default cache: <data>/{DEFAULT_CACHE_DIRNAME})")
        cache_dir = default_cache_dir(data_dir)
    stats: Dict[str, Any] = {}
    paths = extract_features(teacher, images, cache_dir, progress=progress, stats=stats, distributed=distributed)
    return DatasetMaps(teacher, paths, True, stats)
