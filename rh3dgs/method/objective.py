"""The semantic objective of Rh-3DGS: ONE definition for ``distill()`` and ``ns-train rh3dgs``.

What a training step of either path computes from a render of the latents (B views):

    z_hat  = normalize( Dec pool_T( sum_i w_i f_i + (1 - A) f_bg ) )        rendered, at the teacher's grid
    w_bar  = pool_T( VCD(A, D1, D2) )                                       pixel reliability (no gradient)
    L_sem  = VFM(z_hat, z, w_bar)  or  cosine: sum w_bar (1 - <z_hat, z>) / sum w_bar
    L_ray  = mean over covered pixels of  sum_i w_i |f_i - F / A|^2  =  A - |F|^2 / A      (unit f_i)
    L      = lambda_sem (L_sem + lambda_ray L_ray) + lambda_con LIC(normalize(Dec f_i), means, colours)   [use_lic]

* ``pool_T`` compares at the **teacher's resolution** (``resolution="teacher"``, default): dense
  CLIP features are patch tokens, each describing everything in its patch, so the render is
  area-pooled to the teacher map's own grid (``[h, w]`` of the map as the teacher gives it) instead
  of upsampling the teacher to the image. Upsampled patch features are blurred across object
  boundaries and a field that fits them pixel by pixel learns the blur; the pooled comparison
  asks only that the sharp render *averages* to each patch feature (a forward model of the
  teacher, as FeatUp does in 2D). For a teacher at image resolution (SAM-mask features) pooling
  is the identity. ``resolution="image"`` upsamples the teacher instead (the paper's reading).
* ``f_bg`` is a learnt background latent: a patch that covers the silhouette of the scene is a
  mix of surfaces and of what lies behind them, as in the teacher.
* ``spherical_latents`` (default): each Gaussian's latent is normalised before compositing, so
  every Gaussian carries a unit feature on the decoder's sphere and its decoded class is the
  class it renders with (no norm tricks that fit pixels while per-Gaussian answers drift).
* ``L_ray`` (ours, :func:`ray_spread`) asks the Gaussians composited along a ray to agree: with
  overlapping Gaussians a pixel's feature is underdetermined (two Gaussians far from the target can mix
  to it), and without this term training drifts along those mixes, away from per-Gaussian answers
  (held-out views and 3D queries lose while the training pixels fit). It is computed from the render
  of the latents and A alone (for unit latents), at no extra rasterization cost. LIC (below) holds much of
  the same drift in 3D, and with both on the strong CLIP-like teacher loses (docs/method.md, section 7).
* LIC (:mod:`rh3dgs.method.lic`, ``LICConfig.rh3dgs()``) pulls each Gaussian's decoded feature towards those of its
  3D neighbours of the same colour: a piece of one surface carries one feature, in the views and between
  them. Its positives come from the Gaussians' colours, not from the features being trained.
* The decoder is initialised with the latents from the training-free lift
  (:func:`rh3dgs.lifting.initial_field`), so training starts from what :func:`rh3dgs.lifting.lift` gives.

The pixel weights are :func:`rh3dgs.method.vcd.pixel_weights`, the lift's definition too (one place).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..ranges import Range, check_fields
from ..field import decoder_factor
from .lic import LICConfig, LICLoss
from .selection import SelectionConfig
from .sphere import geodesic_distance, huber
from .vcd import VCDConfig, pixel_weights, teacher_footprint
from .vfm import VFMConfig, delta_at, kept_segments, vfm_loss

__all__ = ["ObjectiveConfig", "SemanticObjective", "ray_spread", "teacher_grid"]


#: VFM's Huber threshold (rad) when training starts from the lift (development draws of the suite, seed 1000:
#: 0.1 constant +0.78 mIoU over the cosine loss on 20 pairs, where the paper's 1 -> 0.25 rad annealing was +0.00).
#: The default objective keeps VFM's pixel term only (``lambda_mean = 0``): the view-wise Frechet-mean term cost
#: ~55 % of a training step and changed held-out mIoU by -0.2 to -1.7 on the first 6 development pairs
#: (``vfm=VFMConfig(..., lambda_mean=0.1)`` brings it back).
VFM_DELTA = 0.1


def teacher_grid(teacher: Tensor, size: Tuple[int, int]) -> Tuple[int, int]:
    """The grid ``(h, w)`` at which a render of ``size`` is compared with a ``[.., h_t, w_t, D]`` teacher
    map: the map's own grid when it is coarser than the render, else the render's size."""
    h_t, w_t = int(teacher.shape[-3]), int(teacher.shape[-2])
    H, W = int(size[0]), int(size[1])
    return (h_t, w_t) if (h_t <= H and w_t <= W) else (H, W)


RAY_COVERAGE = 0.5
"""The accumulated opacity from which :func:`ray_spread` counts a pixel (as the objective calls it)."""


def ray_spread(latents_2d: Tensor, alpha: Tensor, min_coverage: float = RAY_COVERAGE,
               total: Optional[Tensor] = None) -> Tensor:
    """Mean over covered pixels of the spread of the unit latents composited along each ray.

    With compositing weights ``w_i`` (``A = sum_i w_i``), composite ``F = sum_i w_i f_i`` and unit ``f_i``::

        S(u) = sum_i w_i |f_i - F / A|^2 = sum_i w_i |f_i|^2 - |F|^2 / A = A - |F|^2 / A   in [0, A]

    0 when every Gaussian on the ray carries the same feature. Pixels with ``A < min_coverage`` are left out.

    Args: latents_2d [B, H, W, d] (``sum_i w_i f_i``, no background), alpha [B, H, W]; total: the covered pixels of
    a batch these views are part of (its other views on other processes), instead of theirs.

    >>> import torch
    >>> f = torch.tensor([[[[0.5, 0.5]]]])                  # two Gaussians of weight 0.5, features e0 and e1
    >>> float(ray_spread(f, torch.ones(1, 1, 1)))            # A - |F|^2 / A = 1 - 0.5
    0.5
    """
    cov = (alpha >= min_coverage).to(latents_2d.dtype)
    spread = alpha - (latents_2d * latents_2d).sum(-1) / alpha.clamp_min(1e-6)
    return (cov * spread).sum() / (cov.sum() if total is None else total.to(cov)).clamp_min(1.0)


def _pool(x: Tensor, grid: Tuple[int, int]) -> Tensor:
    """[B, H, W, C] -> [B, h, w, C] area mean (exact blocks when H, W are multiples of h, w: one reduction over
    the blocks of the channels-last map; otherwise ``adaptive_avg_pool2d``'s overlapping cells)."""
    B, H, W, C = x.shape
    h, w = int(grid[0]), int(grid[1])
    if (H, W) == (h, w):
        return x
    if H % h == 0 and W % w == 0:
        return x.reshape(B, h, H // h, w, W // w, C).mean(dim=(2, 4))
    return F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), (h, w)).permute(0, 2, 3, 1)


@dataclass
class ObjectiveConfig:
    """Settings of the semantic objective; the ablation switches are use_vcd, use_vfm and use_lic (docs/method.md,
    section 7, says why each default is what it is)."""

    use_vcd: bool = True
    """VCD reliability weights on the pixels (off: uniform on covered pixels with a teacher feature)."""
    vcd: VCDConfig = field(default_factory=lambda: VCDConfig.rh3dgs(mixing_coarse_only=True))
    """VCD's terms: the lift's, with opacity and depth variance only against teachers coarser than the render."""
    use_vfm: bool = True
    """Geodesic Huber pixel term + robust Frechet-mean term (off: 1 - cosine)."""
    vfm: Optional[VFMConfig] = None
    """VFM's settings (None: a constant 0.1 rad Huber threshold, no mean term: training starts from the lift)."""
    use_lic: bool = True
    """LIC on the decoded features: each Gaussian pulled to its 3D neighbours of the same colour."""
    lic: Optional[LICConfig] = None
    """LIC's settings (None: LICConfig.rh3dgs(), its start and refresh scaled to the run)."""
    lambda_sem: Annotated[float, Range(ge=0)] = 1.0
    """Weight of the semantic pixel loss, >= 0."""
    lambda_con: Annotated[float, Range(ge=0)] = 0.3
    """Weight of LIC, >= 0; larger (1, 3) costs the strong CLIP-like teacher."""
    lambda_ray: Annotated[float, Range(ge=0)] = 0.1
    """Weight of the ray-consistency term ray_spread() inside lambda_sem, >= 0 (0: off)."""
    lic_start: Annotated[float, Range(ge=0, le=1)] = 0.0
    """LIC's start as a fraction of the run, in [0, 1] (the paper warms up from random latents)."""
    resolution: str = "teacher"
    """teacher: pool the render to the teacher map's grid; image: upsample the teacher to the render."""
    spherical_latents: bool = True
    """Normalise every Gaussian's latent before compositing (unit features per Gaussian)."""
    background_latent: bool = True
    """Composite a learnt background latent where the render is transparent (1 - A)."""
    min_coverage: Annotated[float, Range(ge=0, le=1)] = 0.5
    """resolution image: pixels with accumulated opacity below this are left out."""
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    """Check views, the best step, the per-Gaussian fallback, the refit (rh3dgs.method.selection); off: it lost on development."""

    def __post_init__(self) -> None:
        if self.resolution not in ("teacher", "image"):
            raise ConfigError(f"ObjectiveConfig.resolution must be 'teacher' or 'image', got {self.resolution!r}")
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)

    @property
    def label(self) -> str:
        on = [n for n, f in (("VCD", self.use_vcd), ("VFM", self.use_vfm), ("ray", self.lambda_ray > 0),
                             ("LIC", self.use_lic)) if f]
        return " + ".join(on) if on else "cosine"

    def vfm_config(self, steps: int) -> VFMConfig:
        if self.vfm is not None:
            return self.vfm
        return VFMConfig(schedule="constant", delta_start=VFM_DELTA, delta_end=VFM_DELTA, anneal_steps=max(1, int(steps)),
                         lambda_mean=0.0)

    def lic_config(self, steps: int, seed: int = 0) -> LICConfig:
        if self.lic is not None:
            return self.lic
        return LICConfig.rh3dgs(warmup_steps=int(self.lic_start * steps), refresh_every=max(1, steps // 4), seed=seed)


class SemanticObjective(torch.nn.Module):
    """The objective with its state: the LIC graph / pseudo-instances and the background latent.

    Args:
        cfg: :class:`ObjectiveConfig`; latent_dim: d; steps: length of the run (sets the schedules).

    Use per step: ``latents = obj.gaussian_latents(raw)``, render them, then
    ``loss, parts = obj(step, render_result_latents, alpha, d1, d2, decoder, teacher)`` and
    ``loss = loss + obj.lic_loss(step, latents, decoder, means)``.
    """

    def __init__(self, cfg: ObjectiveConfig, latent_dim: int, steps: int, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.steps = int(steps)
        self.vfm_cfg = cfg.vfm_config(steps)
        self.lic = LICLoss(cfg.lic_config(steps, seed)) if cfg.use_lic and cfg.lambda_con > 0 else None
        self.background = torch.nn.Parameter(torch.zeros(latent_dim), requires_grad=cfg.background_latent)

    def gaussian_latents(self, raw: Tensor) -> Tensor:
        """Per-Gaussian latents as rendered: unit rows with ``spherical_latents`` (zero rows stay zero)."""
        return F.normalize(raw, dim=-1) if self.cfg.spherical_latents else raw

    @property
    def uses_regions(self) -> bool:
        """Whether the pixel weights read the teacher's regions (VCD's mask-specificity term)."""
        return self.cfg.use_vcd and self.cfg.vcd.reads_regions

    def compare(self, latents_2d: Tensor, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, decoder: Tensor,
                teacher: Tensor, regions: Optional[Tensor] = None,
                footprint: Optional[float] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """What the pixel loss compares, at the comparison grid ``(h, w)`` (``resolution``).

        Args: as :meth:`forward`. Returns ``(pred, z, w)``: pred [B, h, w, D] decoded (pooled) render with the
        background latent, not normalised; z [B, h, w, D] unit teacher (zero rows: no feature); w [B, h, w]
        pixel weights (no gradient; 0 where the teacher gives no feature).
        """
        grid, z, w = self.targets((int(latents_2d.shape[1]), int(latents_2d.shape[2])), alpha, depth_m1, depth_m2,
                                  teacher, regions, footprint)
        pooled = _pool(latents_2d, grid)
        if self.cfg.background_latent:  # after the (linear) pooling: the same sum at the grid's size, not the render's
            pooled = pooled + (1.0 - _pool(alpha[..., None], grid)) * self.background
        pred = pooled @ decoder.T  # [B, h, w, D], normalised by the losses
        return pred, z, w

    def targets(self, size: Tuple[int, int], alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, teacher: Tensor,
                regions: Optional[Tensor] = None, footprint: Optional[float] = None) -> tuple:
        """What a render of ``size`` (H, W) is compared with: ``(grid, z, w)``, the comparison grid (h, w), the unit
        teacher z [B, h, w, D] and the pixel weights w [B, h, w] of :meth:`compare` (none depends on the latents)."""
        cfg = self.cfg
        H, W = size
        grid = teacher_grid(teacher, (H, W)) if cfg.resolution == "teacher" else (H, W)
        from ..teachers.maps import prepare_map, region_fraction

        with torch.no_grad():
            z = torch.stack([prepare_map(t, grid) for t in teacher])  # [B, h, w, D] unit
            if not self.uses_regions:
                regions = None
            elif regions is None:
                regions = region_fraction(teacher, (H, W))
            regions = None if regions is None else regions.to(alpha.device)
        if grid == (H, W):
            z_img = z
        else:  # pixel weights need the teacher at the render's size only for feature edges
            z_img = torch.stack([prepare_map(t, (H, W)) for t in teacher]) if cfg.vcd.edge_features else None
        min_cov = cfg.min_coverage if grid == (H, W) and not cfg.background_latent else 0.0
        if footprint is None:  # read off the map as given
            footprint = teacher_footprint((int(teacher.shape[-3]), int(teacher.shape[-2])), (H, W))
        w_img = pixel_weights(alpha, depth_m1, depth_m2, z_img if z_img is not None else None, use_vcd=cfg.use_vcd,
                              vcd=cfg.vcd, min_coverage=min_cov, footprint=footprint, region_fraction=regions)
        w = _pool(w_img[..., None], grid)[..., 0] * (torch.linalg.vector_norm(z, dim=-1) > 0.5)
        return grid, z, w

    def totals(self, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, teacher: Tensor,
               regions: Optional[Tensor] = None, footprint: Optional[float] = None) -> Tensor:
        """[3] float64: what :meth:`forward` divides its terms by, for these views: the pixel weights' sum (the VFM or
        cosine pixel term), the covered pixels (the ray term) and the kept segments (VFM's mean term).

        Additive over views. A step's batch split over processes (``distill()`` in a ``torch.distributed`` group)
        passes the sum over the whole batch to ``forward(totals=...)``: each process's loss is then its share of the
        batch's loss (numerators over its views, denominators over all of them), and the shares' gradients add up
        to the batch's. Args as :meth:`forward`, without the latents (none of these depends on them)."""
        H, W = int(alpha.shape[1]), int(alpha.shape[2])
        grid, _, w = self.targets((H, W), alpha, depth_m1, depth_m2, teacher, regions, footprint)
        segments = 0
        if self.cfg.use_vfm and self.vfm_cfg.lambda_mean > 0:
            region_ids = None
            if self.vfm_cfg.region_wise:
                from ..teachers.maps import constant_regions

                region_ids = constant_regions(teacher, grid).to(w.device)
            segments = kept_segments(w, region_ids, self.vfm_cfg)
        covered = float((alpha >= RAY_COVERAGE).sum()) if self.cfg.lambda_ray > 0 else 0.0
        return torch.tensor([float(w.sum()), covered, float(segments)], dtype=torch.float64)

    @staticmethod
    def pool(x: Tensor, grid: Tuple[int, int]) -> Tensor:
        """[B, H, W, C] -> [B, h, w, C]: the area mean the objective compares renders and teacher maps with."""
        return _pool(x, grid)

    def cell_losses(self, latents_2d: Tensor, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, decoder: Tensor,
                    teacher: Tensor, regions: Optional[Tensor] = None,
                    footprint: Optional[float] = None) -> Tuple[Tensor, Tensor]:
        """The pixel term per cell of the comparison grid, ``(loss [B, h, w], weight [B, h, w])``: the geodesic Huber
        loss at VFM's threshold of the run's last step (``use_vfm``; else 1 - cosine) and the pixel weights of
        :meth:`compare`. The selection's check loss (:mod:`rh3dgs.method.selection`); arguments as :meth:`forward`."""
        pred, z, w = self.compare(latents_2d, alpha, depth_m1, depth_m2, decoder, teacher, regions, footprint)
        zs = F.normalize(pred, dim=-1)
        if self.cfg.use_vfm:
            loss = huber(geodesic_distance(zs, z), delta_at(self.steps, self.vfm_cfg))
        else:
            loss = 1.0 - (zs * z).sum(-1)
        return loss, w

    def forward(self, step: int, latents_2d: Tensor, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor,
                decoder: Tensor, teacher: Tensor, regions: Optional[Tensor] = None,
                footprint: Optional[float] = None, totals: Optional[Tensor] = None) -> Tuple[Tensor, Dict[str, float]]:
        """Semantic pixel loss of B rendered views.

        Args:
            latents_2d: [B, H, W, d] composited latents; alpha, depth_m1, depth_m2: [B, H, W] render statistics.
            decoder: [D, d]; teacher: [B, h, w, D] maps as the teacher gives them (any resolution, unit or zero rows).
            regions: [B, H, W] :func:`rh3dgs.teachers.maps.region_fraction` of the teacher maps at the render's size,
                when the caller keeps them per view (None: computed here when :attr:`uses_regions`).
            footprint: pixels of the render each cell of the teacher's own map describes
                (:func:`rh3dgs.method.vcd.teacher_footprint`; VCD's ``mixing_coarse_only``), for a caller that resized the
                map (None: read off ``teacher``).
            totals: [3] :meth:`totals` summed over a batch these views are part of (the rest on other processes):
                the terms are then divided by the batch's normalisers, not these views' own.
        Returns:
            ``(lambda_sem * L_sem, parts)``.
        """
        cfg = self.cfg
        pred, z, w = self.compare(latents_2d, alpha, depth_m1, depth_m2, decoder, teacher, regions, footprint)
        if cfg.use_vfm:
            region_ids = None  # the teacher's own regions (a mask teacher's masks) for region-wise means
            if self.vfm_cfg.region_wise and self.vfm_cfg.lambda_mean > 0:
                from ..teachers.maps import constant_regions

                region_ids = constant_regions(teacher, tuple(pred.shape[1:3])).to(pred.device)
            loss, p = vfm_loss(pred, z, w, step, self.vfm_cfg, regions=region_ids,
                               totals=None if totals is None else (totals[0], totals[2]))
            parts = {"pix": float(p["pix"]), "mean": float(p["mean"]), "delta": float(p["delta"])}
        else:
            cos = (F.normalize(pred, dim=-1) * z).sum(-1)
            loss = (w * (1.0 - cos)).sum() / (w.sum() if totals is None else totals[0].to(w)).clamp_min(1e-12)
            parts = {"pix": float(loss.detach())}
        if cfg.lambda_ray > 0:
            ray = ray_spread(latents_2d, alpha, total=None if totals is None else totals[1])
            loss = loss + cfg.lambda_ray * ray
            parts["ray"] = float(ray.detach())
        return cfg.lambda_sem * loss, parts

    def lic_loss(self, step: int, latents: Tensor, decoder: Tensor, means: Tensor,
                 subset: Optional[Tensor] = None, colors: Optional[Tensor] = None) -> Tensor:
        """``lambda_con * LIC`` on the decoded unit features of the Gaussians (``subset``: indices to use; ``colors``
        [N, 3]: the Gaussians' colours, read by LIC's appearance positives when its graph is rebuilt, so a caller may
        pass None on the other steps, :meth:`rh3dgs.method.lic.LICLoss.needs_refresh`).

        LIC only compares features by cosines and spherical means, so it runs on the decoded features' coordinates
        in the decoder's column space, ``f @ R.T`` (:func:`rh3dgs.field.decoder_factor`), which it normalises row by
        row itself: the same loss and gradients as on ``normalize(f @ decoder.T)`` at d instead of D numbers per
        Gaussian. For the same reason ``latents`` may be given at any positive scale per row (raw or unit)."""
        if self.lic is None or step < self.lic.cfg.warmup_steps:
            return latents.reshape(-1)[:0].sum()
        f, m = (latents, means) if subset is None else (latents[subset], means[subset])
        c = colors if colors is None or subset is None else colors[subset]
        feats = f @ decoder_factor(decoder).T
        return self.cfg.lambda_con * self.lic(feats, step, means=m.detach(), colors=c)
