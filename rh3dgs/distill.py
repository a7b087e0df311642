"""Semantic distillation on FIXED Gaussian geometry (no nerfstudio, no RGB loss).

Optimises per-Gaussian latents ``f [N, d]`` and a linear decoder ``Dec [D, d]`` so that the
rendered, decoded, normalised features ``z_hat(u) = normalize(Dec sum_i w_i(u) f_i)`` match
the teacher maps ``z(u)``. Rendering goes through :func:`rh3dgs.rendering.render` (differentiable
w.r.t. the latents); the geometry (means, scales, rotations, opacities) is not touched, so
this is the semantic half of the paper's objective ``L_rgb + lambda_sem L_VFM + lambda_con L_LIC``
with ``L_rgb`` dropped.

Loss variants (the ablation switches of :class:`DistillConfig`):

==========================  =================================================================
``use_vcd=False, use_vfm=False``  baseline: ``mean_u (1 - cos(z_hat, z))`` over covered pixels
``use_vcd=True``            the same (or VFM's) pixel loss weighted by VCD's ``w_bar`` computed
                            from the render statistics (A, D1, D2) and the teacher map
``use_vfm=True``            :func:`rh3dgs.vfm.vfm_loss` (geodesic Huber pixel term + robust
                            Frechet-mean term), ``delta`` annealed by :func:`rh3dgs.vfm.delta_at`
``use_lic=True``            + ``lambda_con`` * :class:`rh3dgs.lic.LICLoss` on the decoded
                            per-Gaussian features, after its warm-up
==========================  =================================================================

**Choices** (the paper is silent; each is a config field):

* *Fixed geometry* => the render statistics and the VCD weights of each view are constant:
  they are computed once, under ``no_grad``, before the optimisation.
* *Pixels*: only pixels with accumulated opacity ``>= min_coverage`` and a non-zero teacher
  feature count (the baseline's "uniform weights" are uniform over these).
* *Initialisation* ``init="pca"`` (default): decoder = uncentred PCA basis of the teacher
  pixels (the same basis the lift uses), latents ``~ N(0, init_scale^2)``;
  ``init="lift"``: latents and decoder from the training-free lift (:mod:`rh3dgs.lifting`).
* *Schedules*: VFM's ``anneal_steps`` and LIC's ``warmup_steps`` / ``refresh_every`` default to
  fractions of ``steps`` (full anneal over the run; LIC from 40 % of the run, labels
  refreshed 4 times), because the paper's 10k / 5k-step defaults assume a 30k-step run.
* *LIC* runs on the decoded unit features of the valid Gaussians only (Gaussians no
  counted pixel sees have no semantics to make consistent, and would otherwise be
  clustered and contrasted at their random initial values).
* *Views*: ``views_per_step`` views per step, drawn without replacement per epoch from a
  seeded generator; the whole run is deterministic for a given ``seed`` on CPU.
* *Validity*: a Gaussian is ``valid`` when its total compositing weight over the counted
  pixels of all views, ``sum_{v,u} alpha_i T_i(u) w(u)``, is ``>= min_weight`` (as in the
  lift); others never receive a pixel gradient and are reported as invalid.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError
from .gaussians import Gaussians
from .lic import LICConfig, LICLoss
from .lifting import LiftConfig, lift, pca_decoder
from .progress import track
from .rendering import render
from .teachers.maps import TeacherMaps, prepare_maps
from .vcd import VCDConfig, reliability_weights
from .vfm import VFMConfig, vfm_loss

__all__ = ["DistillConfig", "DistillResult", "distill"]

@dataclass
class DistillConfig:
    """Settings of :func:`distill`."""

    steps: int = 300
    """Optimisation steps."""
    views_per_step: int = 2
    """Views rendered per step."""
    latent_dim: int = 16
    """d, the latent dimension."""
    lr: float = 0.02
    """Adam learning rate of the latents."""
    decoder_lr: float = 0.002
    """Adam learning rate of the decoder."""
    init: str = "pca"
    """"pca" (PCA decoder of teacher pixels, random latents) or "lift" (training-free lift)."""
    init_scale: float = 0.1
    """Std of the random initial latents (init="pca")."""
    min_coverage: float = 0.5
    """Pixels with accumulated opacity below this are ignored."""
    use_vcd: bool = False
    """Weight pixels by VCD reliability."""
    vcd: VCDConfig = field(default_factory=VCDConfig)
    use_vfm: bool = False
    """Geodesic Huber pixel term + Frechet-mean term (else 1 - cos)."""
    vfm: Optional[VFMConfig] = None
    """VFM settings; None: defaults with ``anneal_steps = steps``."""
    lambda_sem: float = 1.0
    """Weight of the semantic (pixel) loss."""
    use_lic: bool = False
    """Add the LIC contrastive loss after its warm-up."""
    lic: Optional[LICConfig] = None
    """LIC settings; None: defaults with ``warmup_steps = 0.4 steps``, ``refresh_every = 0.15 steps``,
    ``num_anchors = 512``, ``seed = seed``."""
    lambda_con: float = 0.1
    """Weight of the LIC loss."""
    lift: LiftConfig = field(default_factory=LiftConfig)
    """Settings of the lift used by init="lift" (its latent_dim is overridden by ``latent_dim``)."""
    seed: int = 0
    min_weight: float = 1e-6
    """Gaussians whose total compositing weight on counted pixels is below this are invalid."""
    tile_size: int = 16

    def __post_init__(self) -> None:
        if self.steps < 0 or self.views_per_step < 1 or self.latent_dim < 1:
            raise ConfigError("DistillConfig: steps >= 0, views_per_step >= 1 and latent_dim >= 1 are required")
        if self.init not in ("pca", "lift"):
            raise ConfigError(f"DistillConfig.init must be 'pca' or 'lift', got {self.init!r}")
        if not (self.lr > 0 and self.decoder_lr >= 0):
            raise ConfigError("DistillConfig: lr must be > 0 and decoder_lr >= 0")

    def vfm_config(self) -> VFMConfig:
        return self.vfm if self.vfm is not None else VFMConfig(anneal_steps=max(1, self.steps))

    def lic_config(self) -> LICConfig:
        if self.lic is not None:
            return self.lic
        return LICConfig(warmup_steps=int(0.4 * self.steps), refresh_every=max(1, int(0.15 * self.steps)),
                         num_anchors=512, seed=self.seed)

    @property
    def label(self) -> str:
        if not (self.use_vcd or self.use_vfm or self.use_lic):
            return "distill (cosine)"
        return "distill + " + " + ".join(n for n, on in (("VCD", self.use_vcd), ("VFM", self.use_vfm),
                                                          ("LIC", self.use_lic)) if on)


@dataclass
class DistillResult:
    """latents [N, d], decoder [D, d], features [N, D] (unit decoded latents), valid [N] bool,
    history (per step: loss, sem, lic, delta), info (timings, settings)."""

    latents: Tensor
    decoder: Tensor
    features: Tensor
    valid: Tensor
    history: List[Dict[str, float]]
    info: Dict[str, object]


def distill(
    gaussians: Gaussians,
    cameras: Cameras,
    teacher_maps: TeacherMaps,
    cfg: Optional[DistillConfig] = None,
    progress: bool = False,
) -> DistillResult:
    """Distil teacher feature maps into per-Gaussian latents + a linear decoder (geometry fixed).

    Args:
        gaussians: the scene (its parameters are not modified).
        cameras: B training views (their resolution is the training resolution).
        teacher_maps: [B, h, w, D], a sequence of [h, w, D] or a callable ``i -> [h, w, D]``;
            bilinearly resized to the camera resolution and normalised (zero = ignored pixel).
        cfg: :class:`DistillConfig`.
    """
    cfg = cfg or DistillConfig()
    t0 = time.perf_counter()
    dev = gaussians.device
    B, N = len(cameras), len(gaussians)
    H, W = int(cameras.height), int(cameras.width)
    gen = torch.Generator().manual_seed(int(cfg.seed))

    # ---- teacher maps and constant per-view statistics (geometry is fixed)
    maps = prepare_maps(teacher_maps, range(B), (H, W), dev)  # [B,H,W,D]
    D = maps.shape[-1]
    ones = torch.ones(N, 1, device=dev, requires_grad=True)
    weights = []
    for s in range(0, B, 8):
        idx = list(range(s, min(s + 8, B)))
        r = render(gaussians, cameras[idx], ones, rgb=False, tile_size=cfg.tile_size)
        with torch.no_grad():
            valid_px = (r.alpha >= cfg.min_coverage) & (maps[idx].norm(dim=-1) > 0.5)
            if cfg.use_vcd:
                w = reliability_weights(r.alpha, r.d1, r.d2, features=maps[idx], cfg=cfg.vcd, valid_mask=valid_px)
            else:
                w = valid_px.float()
        # d/d(ones) of sum_u w(u) sum_i w_i(u) * 1 = per-Gaussian total compositing weight on counted pixels
        (r.features[..., 0] * w).sum().backward()
        weights.append(w)
    gauss_weight = ones.grad[:, 0].detach()
    valid = gauss_weight > cfg.min_weight
    weights_all = torch.cat(weights)  # [B, H, W]
    t_stats = time.perf_counter() - t0

    # ---- initialisation
    d = min(cfg.latent_dim, D)
    if cfg.init == "lift":
        res = lift(gaussians, cameras, maps, replace(cfg.lift, latent_dim=d), progress=False)
        decoder0, latents0 = res.decoder.clone(), res.latents.clone()
        rnd = torch.randn(N, d, generator=gen).to(dev) * cfg.init_scale
        latents0 = torch.where(res.valid[:, None], latents0, rnd)
    else:
        px = maps[weights_all > 0]
        if px.shape[0] > 200_000:
            px = px[torch.randperm(px.shape[0], generator=gen)[:200_000].to(dev)]
        if px.shape[0] == 0:
            raise ConfigError("distill: no covered pixel with a teacher feature in any view")
        decoder0, _ = pca_decoder(px, torch.ones(px.shape[0], device=dev), d)
        latents0 = torch.randn(N, d, generator=gen).to(dev) * cfg.init_scale
    latents = latents0.clone().requires_grad_(True)
    decoder = decoder0.clone().requires_grad_(cfg.decoder_lr > 0)
    groups = [{"params": [latents], "lr": cfg.lr}]
    if cfg.decoder_lr > 0:
        groups.append({"params": [decoder], "lr": cfg.decoder_lr})
    opt = torch.optim.Adam(groups)

    vfm_cfg = cfg.vfm_config()
    lic = LICLoss(cfg.lic_config()) if cfg.use_lic else None
    valid_idx = torch.nonzero(valid).flatten()
    means_valid = gaussians.means.detach()[valid_idx]
    order: List[int] = []
    history: List[Dict[str, float]] = []
    for step in track(range(cfg.steps), description=f"distill: {cfg.label}", disable=not progress):
        if len(order) < cfg.views_per_step:
            order += torch.randperm(B, generator=gen).tolist()
        idx, order = order[:cfg.views_per_step], order[cfg.views_per_step:]
        opt.zero_grad(set_to_none=True)
        r = render(gaussians, cameras[idx], latents, rgb=False, tile_size=cfg.tile_size)
        z_hat = F.normalize(r.features @ decoder.T, dim=-1)  # [b, H, W, D]
        z, w = maps[idx], weights_all[idx]
        parts: Dict[str, float] = {}
        if cfg.use_vfm:
            l_sem, p = vfm_loss(z_hat, z, w, step, vfm_cfg)
            parts = {"pix": float(p["pix"]), "mean": float(p["mean"]), "delta": float(p["delta"])}
        else:
            cos = (z_hat * z).sum(-1)
            l_sem = (w * (1.0 - cos)).sum() / w.sum().clamp_min(1e-12)
        loss = cfg.lambda_sem * l_sem
        l_con = 0.0
        if lic is not None and step >= lic.cfg.warmup_steps:
            feats = F.normalize(latents[valid_idx] @ decoder.T, dim=-1)
            lc = lic(feats, step, means=means_valid)
            loss = loss + cfg.lambda_con * lc
            l_con = float(lc.detach())
        loss.backward()
        opt.step()
        history.append({"step": step, "loss": float(loss.detach()), "sem": float(l_sem.detach()), "lic": l_con, **parts})

    with torch.no_grad():
        lat = latents.detach()
        dec = decoder.detach()
        feats = F.normalize(lat @ dec.T, dim=-1)
    info = {"label": cfg.label, "steps": cfg.steps, "views": B, "gaussians": N, "valid": int(valid.sum()),
            "seconds": time.perf_counter() - t0, "seconds_stats": t_stats, "init": cfg.init,
            "final_loss": history[-1]["loss"] if history else math.nan}
    return DistillResult(lat, dec, feats, valid, history, info)
