"""``aggregate_sphere``: one pass of the per-Gaussian robust spherical mean (native op).

For every contribution w = alpha_i T_i(u) * pixel_weights(u) of Gaussian i to pixel u
with unit teacher feature z(u), accumulate (mode "init") sum w and sum w z, or (mode
"irls") the Huber-IRLS tangent terms of one Frechet-mean step around ``mu``:
omega = w * min(1, delta / theta), sum omega, sum omega Log_mu(z). No (pixel, Gaussian)
pair is stored; the reference :func:`rh3dgs.ops._ref._ref_aggregate_sphere` enumerates them.

On CPU, :func:`aggregate_sphere_replay` runs a pass over the contributions a forward
rasterization recorded (``rasterize_to_pixels(record=True)``) instead of compositing the views
again, bit-identical to the traversal (the lift does this when the recording fits its cache budget), over one
recording or several at once (the lift's chunks of views: one call per pass).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..errors import ShapeError
from ._backend import has_native_kernel, native_ops
from .rasterize import Contributions

__all__ = ["aggregate_sphere", "aggregate_sphere_replay", "Contributions"]

_MODES = {"init": 0, "irls": 1}


def _mode_and_mu(mode: str, mu: Optional[Tensor], N: int, pixel_feats: Tensor) -> Tensor:
    """Checks ``mode``; ``mu`` [N, D] checked, or zeros (unused by "init") when None."""
    if mode not in _MODES:
        raise ShapeError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    D = pixel_feats.shape[-1]
    if mu is None:
        mu = pixel_feats.new_zeros(N, D)
    if mu.shape != (N, D):
        raise ShapeError(f"mu must be [N, D] = {[N, D]}, got {list(mu.shape)}")
    return mu


@torch.no_grad()
def aggregate_sphere(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    pixel_feats: Tensor,
    pixel_weights: Tensor,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    tile_size: int,
    mu: Optional[Tensor] = None,
    delta: float = float("inf"),
    mode: str = "irls",
) -> Tuple[Tensor, Tensor, Tensor]:
    """Accumulate per-Gaussian spherical statistics over all pixels of B views.

    Args:
        means2d, conics, opacities: [B, N, 2], [B, N, 3], [B, N] projected Gaussians.
        pixel_feats:   [B, H, W, D] unit teacher features.
        pixel_weights: [B, H, W] per-pixel reliability (VCD w_bar; 0 skips the pixel).
        isect_offsets, flatten_ids: tile binning (:func:`rh3dgs.ops.isect_tiles`).
        mu:    [N, D] current unit means (mode "irls"); ignored for "init".
        delta: Huber threshold in radians (inf = Karcher / least squares).
        mode:  "init" (weighted Euclidean sums) or "irls" (one Huber-IRLS step).

    Returns:
        acc_w [N] (sum of omega, or of w for "init"), acc_v [N, D] (sum omega Log_mu(z),
        or sum w z for "init"), acc_raw [N] (sum of alpha_i(u) * pixel_weights(u) over the same
        contributions, without the transmittance: in "init" mode acc_w / acc_raw is the Gaussian's
        mean transmittance where it composites, i.e. how much of it the views see).
    """
    B, N = means2d.shape[:2]
    if pixel_feats.dim() != 4 or pixel_feats.shape[0] != B:
        raise ShapeError(f"pixel_feats must be [B, H, W, D] with B={B}, got {list(pixel_feats.shape)}")
    mu = _mode_and_mu(mode, mu, N, pixel_feats)
    if means2d.is_cuda and not has_native_kernel("aggregate_sphere", means2d.device):
        raise NotImplementedError("aggregate_sphere on CUDA needs rh3dgs built with RH3DGS_BUILD_CUDA=1")
    return native_ops().aggregate_sphere(
        means2d.float().contiguous(), conics.float().contiguous(), opacities.float().contiguous(),
        pixel_feats.float().contiguous(), pixel_weights.float().contiguous(), mu.float().contiguous(),
        float(delta), _MODES[mode], N, int(tile_size), isect_offsets.int().contiguous(), flatten_ids.int().contiguous(),
    )


@torch.no_grad()
def aggregate_sphere_replay(
    contributions: Union[Contributions, Sequence[Contributions]], pixel_feats: Union[Tensor, Sequence[Tensor]],
    pixel_weights: Union[Tensor, Sequence[Tensor]], mu: Optional[Tensor] = None, delta: float = float("inf"),
    mode: str = "irls", active: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`aggregate_sphere` over the contributions a forward of the same views recorded
    (:func:`rh3dgs.ops.rasterize_to_pixels` with ``record=True``): any ``pixel_feats`` [B, H, W, D],
    ``pixel_weights`` [B, H, W] and ``mu``.

    Bit-identical to the traversal with as many threads; no compositing is redone.
    ``active`` [N] bool: skip the contributions of the Gaussians marked False (their sums are 0, the
    others' unchanged): a pass costs what its active Gaussians contribute.

    Several recordings (renders of different views of the same N Gaussians) in one call: sequences of
    ``contributions``, ``pixel_feats`` and ``pixel_weights``, one of each per recording; the result is
    the sum of their passes (each thread's sums added in order, so not bit for bit the sum of separate
    calls), with one set of per-thread sums to clear and add up instead of one per recording.

    Example (a render of one Gaussian over a 16 x 16 tile, replayed as one recording and as two)::

        >>> from rh3dgs.ops import isect_tiles, rasterize_to_pixels
        >>> m2d, con, op = torch.tensor([[[8.0, 8.0]]]), torch.tensor([[[0.1, 0.0, 0.1]]]), torch.tensor([[0.9]])
        >>> _, offs, ids = isect_tiles(m2d, torch.tensor([[8]], dtype=torch.int32), torch.ones(1, 1), 16, 1, 1)
        >>> rec = rasterize_to_pixels(m2d, con, torch.ones(1, 1, 3), op, torch.ones(1, 1), 16, 16, 16, offs, ids,
        ...                           record=True).contributions
        >>> z, w = torch.nn.functional.normalize(torch.ones(1, 16, 16, 4), dim=-1), torch.ones(1, 16, 16)
        >>> one = aggregate_sphere_replay(rec, z, w, mode="init")[0]
        >>> two = aggregate_sphere_replay([rec, rec], [z, z], [w, w], mode="init")[0]
        >>> bool(one > 0) and torch.allclose(two, 2 * one)
        True
    """
    many = not isinstance(contributions, Contributions)
    recs = list(contributions) if many else [contributions]
    feats = list(pixel_feats) if many else [pixel_feats]
    weights = list(pixel_weights) if many else [pixel_weights]
    if not recs or len(feats) != len(recs) or len(weights) != len(recs):
        raise ShapeError(f"aggregate_sphere_replay: {len(recs)} recordings need as many pixel_feats and pixel_weights, "
                         f"got {len(feats)} and {len(weights)}")
    N = recs[0].num_gaussians
    mu = _mode_and_mu(mode, mu, N, feats[0])
    if active is not None and tuple(active.shape) != (N,):
        raise ShapeError(f"active must be [N] = [{N}], got {list(active.shape)}")
    for c, f, w in zip(recs, feats, weights):
        shape = tuple(c.image_shape)
        if c.num_gaussians != N:
            raise ShapeError(f"aggregate_sphere_replay: recordings of {N} and {c.num_gaussians} Gaussians")
        if f.dim() != 4 or tuple(f.shape[:3]) != shape or tuple(w.shape) != shape or f.shape[-1] != mu.shape[1]:
            raise ShapeError(f"the contributions were recorded on [B, H, W] = {list(shape)} pixels: pixel_feats must be "
                             f"[B, H, W, D] and pixel_weights [B, H, W], got {list(f.shape)} and {list(w.shape)}")
    return native_ops().aggregate_sphere_replay(
        [c.seg_offsets for c in recs], [c.pair_offsets for c in recs], [c.segments for c in recs],
        [c.lanes for c in recs], [c.weights for c in recs], [c.masses for c in recs],
        [f.float().contiguous() for f in feats], [w.float().contiguous() for w in weights], mu.float().contiguous(),
        float(delta), _MODES[mode], None if active is None else active.bool().contiguous())
