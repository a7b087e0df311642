"""The semantic objective of Rh-3DGS: ONE definition for ``distill()`` and ``ns-train rh3dgs``.

What a training step of either path computes from a render of the latents (B views):

    z_hat  = normalize( Dec pool_T( sum_i w_i f_i + (1 - A) f_bg ) )        rendered, at the teacher's grid
    w_bar  = pool_T( VCD(A, D1, D2) )                                       pixel reliability (no gradient)
    L_sem  = VFM(z_hat, z, w_bar)  or  cosine: sum w_bar (1 - <z_hat, z>) / sum w_bar
    L      = lambda_sem L_sem + lambda_con LIC(normalize(Dec f_i), means)   (LIC after its start step)

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
* The decoder is initialised with the latents from the training-free lift
  (:func:`initial_field`), so training starts from what :func:`rh3dgs.lifting.lift` gives.

The pixel weights are :func:`rh3dgs.vcd.pixel_weights`, the lift's definition too (one place).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import ConfigError
from .lic import LICConfig, LICLoss
from .vcd import VCDConfig, pixel_weights
from .vfm import VFMConfig, vfm_loss

__all__ = ["ObjectiveConfig", "SemanticObjective", "initial_field", "teacher_grid"]


def teacher_grid(teacher: Tensor, size: Tuple[int, int]) -> Tuple[int, int]:
    """The grid ``(h, w)`` at which a render of ``size`` is compared with a ``[.., h_t, w_t, D]`` teacher
    map: the map's own grid when it is coarser than the render, else the render's size."""
    h_t, w_t = int(teacher.shape[-3]), int(teacher.shape[-2])
    H, W = int(size[0]), int(size[1])
    return (h_t, w_t) if (h_t <= H and w_t <= W) else (H, W)


def _pool(x: Tensor, grid: Tuple[int, int]) -> Tensor:
    """[B, H, W, C] -> [B, h, w, C] area mean (exact blocks when H, W are multiples of h, w)."""
    if tuple(x.shape[1:3]) == tuple(grid):
        return x
    return F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), grid).permute(0, 2, 3, 1)


@dataclass
class ObjectiveConfig:
    """Settings of the semantic objective (the ablation switches are ``use_vcd / use_vfm / use_lic``)."""

    use_vcd: bool = True
    """Weight pixels by VCD reliability (False: uniform on covered pixels with a teacher feature)."""
    vcd: VCDConfig = field(default_factory=VCDConfig.rh3dgs)
    """VCD settings (:meth:`rh3dgs.vcd.VCDConfig.rh3dgs`: opacity and depth variance, no edge or footprint
    terms: a small object is a feature bump with edges all around, so teacher-feature edges down-weight
    exactly the views that see it; docs/method.md section 7)."""
    use_vfm: bool = True
    """Geodesic Huber pixel term + robust Frechet-mean term (False: 1 - cosine)."""
    vfm: Optional[VFMConfig] = None
    """VFM settings; None: defaults with ``anneal_steps`` = the run's steps."""
    use_lic: bool = True
    """Add the LIC contrast on the decoded per-Gaussian features."""
    lic: Optional[LICConfig] = None
    """LIC settings; None: :meth:`lic_config` (start and refresh scaled to the run)."""
    lambda_sem: float = 1.0
    """Weight of the semantic pixel loss."""
    lambda_con: float = 0.1
    """Weight of LIC."""
    lic_start: float = 0.0
    """LIC's start as a fraction of the run (training starts from the lift, so its pseudo-instances are
    meaningful from step 0; the paper's warm-up protects random initial latents)."""
    resolution: str = "teacher"
    """'teacher': pool the render to the teacher map's grid; 'image': upsample the teacher to the render."""
    spherical_latents: bool = True
    """Normalise every Gaussian's latent before compositing (unit features per Gaussian)."""
    background_latent: bool = True
    """Composite a learnt background latent where the render is transparent (1 - A)."""
    min_coverage: float = 0.5
    """resolution='image': pixels with accumulated opacity below this are left out."""

    def __post_init__(self) -> None:
        if self.resolution not in ("teacher", "image"):
            raise ConfigError(f"ObjectiveConfig.resolution must be 'teacher' or 'image', got {self.resolution!r}")
        if not (self.lambda_sem >= 0 and self.lambda_con >= 0 and 0.0 <= self.lic_start <= 1.0):
            raise ConfigError("ObjectiveConfig: lambda_sem, lambda_con >= 0 and lic_start in [0, 1] are required")

    @property
    def label(self) -> str:
        on = [n for n, f in (("VCD", self.use_vcd), ("VFM", self.use_vfm), ("LIC", self.use_lic)) if f]
        return " + ".join(on) if on else "cosine"

    def vfm_config(self, steps: int) -> VFMConfig:
        return self.vfm if self.vfm is not None else VFMConfig(anneal_steps=max(1, int(steps)))

    def lic_config(self, steps: int, seed: int = 0) -> LICConfig:
        if self.lic is not None:
            return self.lic
        return LICConfig(warmup_steps=int(self.lic_start * steps), refresh_every=max(1, steps // 4),
                         num_anchors=512, seed=seed)


class SemanticObjective(torch.nn.Module):
    """The objective with its state: the LIC graph / pseudo-instances and the background latent.

    Args:
        cfg: :class:`ObjectiveConfig`; latent_dim: d; steps: length of the run (sets the schedules).

    Use per step: ``latents = obj.gaussian_latents(raw)``, render them, then
    ``loss, parts = obj(step, render_result_latents, alpha, d1, d2, decoder, teacher)`` and
    ``loss = loss + obj.contrast(step, latents, decoder, means)``.
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

    def compare(self, latents_2d: Tensor, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor, decoder: Tensor,
                teacher: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """What the pixel loss compares, at the comparison grid ``(h, w)`` (``resolution``).

        Args: as :meth:`forward`. Returns ``(pred, z, w)``: pred [B, h, w, D] decoded (pooled) render with the
        background latent, not normalised; z [B, h, w, D] unit teacher (zero rows: no feature); w [B, h, w]
        pixel weights (no gradient; 0 where the teacher gives no feature).
        """
        cfg = self.cfg
        H, W = latents_2d.shape[1:3]
        grid = teacher_grid(teacher, (H, W)) if cfg.resolution == "teacher" else (H, W)
        from .teachers.maps import prepare_map

        with torch.no_grad():
            z = torch.stack([prepare_map(t, grid) for t in teacher])  # [B, h, w, D] unit
        if cfg.background_latent:
            latents_2d = latents_2d + (1.0 - alpha)[..., None] * self.background
        if grid == (H, W):
            z_img = z
        else:  # pixel weights need the teacher at the render's size only for feature edges
            z_img = torch.stack([prepare_map(t, (H, W)) for t in teacher]) if cfg.vcd.edge_features else None
        min_cov = cfg.min_coverage if grid == (H, W) and not cfg.background_latent else 0.0
        w_img = pixel_weights(alpha, depth_m1, depth_m2, z_img if z_img is not None else None,
                              use_vcd=cfg.use_vcd, vcd=cfg.vcd, min_coverage=min_cov)
        pred = _pool(latents_2d, grid) @ decoder.T  # [B, h, w, D], normalised by the losses
        w = _pool(w_img[..., None], grid)[..., 0] * (torch.linalg.vector_norm(z, dim=-1) > 0.5)
        return pred, z, w

    def forward(self, step: int, latents_2d: Tensor, alpha: Tensor, depth_m1: Tensor, depth_m2: Tensor,
                decoder: Tensor, teacher: Tensor) -> Tuple[Tensor, Dict[str, float]]:
        """Semantic pixel loss of B rendered views.

        Args:
            latents_2d: [B, H, W, d] composited latents; alpha, depth_m1, depth_m2: [B, H, W] render statistics.
            decoder: [D, d]; teacher: [B, h, w, D] maps as the teacher gives them (any resolution, unit or zero rows).
        Returns:
            ``(lambda_sem * L_sem, parts)``.
        """
        cfg = self.cfg
        pred, z, w = self.compare(latents_2d, alpha, depth_m1, depth_m2, decoder, teacher)
        if cfg.use_vfm:
            loss, p = vfm_loss(pred, z, w, step, self.vfm_cfg)
            parts = {"pix": float(p["pix"]), "mean": float(p["mean"]), "delta": float(p["delta"])}
        else:
            cos = (F.normalize(pred, dim=-1) * z).sum(-1)
            loss = (w * (1.0 - cos)).sum() / w.sum().clamp_min(1e-12)
            parts = {"pix": float(loss.detach())}
        return cfg.lambda_sem * loss, parts

    def contrast(self, step: int, latents: Tensor, decoder: Tensor, means: Tensor,
                 subset: Optional[Tensor] = None) -> Tensor:
        """``lambda_con * LIC`` on the decoded unit features of the Gaussians (``subset``: indices to use)."""
        if self.lic is None or step < self.lic.cfg.warmup_steps:
            return latents.reshape(-1)[:0].sum()
        f, m = (latents, means) if subset is None else (latents[subset], means[subset])
        feats = F.normalize(f @ decoder.T, dim=-1)
        return self.cfg.lambda_con * self.lic(feats, step, means=m.detach())


def initial_field(gaussians, cameras, teacher_maps, latent_dim: int, lift_cfg=None, progress: bool = False):
    """Latents [N, d], decoder [D, d] and the lift's result, from the training-free lift (the start of training)."""
    from .lifting import LiftConfig, lift

    cfg = replace(lift_cfg or LiftConfig(), latent_dim=latent_dim)
    res = lift(gaussians, cameras, teacher_maps, cfg, progress=progress)
    return res.latents, res.decoder, res
