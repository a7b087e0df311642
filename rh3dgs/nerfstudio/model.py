"""``Rh3dgsModel``: :class:`SplatfactoCPUModel` + per-Gaussian semantic latents, a decoder, VCD-weighted VFM and LIC.

The CPU-safe splatfacto is :mod:`rh3dgs.nerfstudio.splatfacto_cpu`; this model is that class plus
(as nerfstudio-method-template's ``populate_modules(): super().populate_modules()``):

* ``gauss_params["latents"]`` [N, d]: beside means / scales / ... so that the densification
  strategy (gsplat's ``DefaultStrategy``, which duplicates / splits / removes *every* entry of the
  params dict together with its optimizer state) carries it.
* ``decoder`` [D, d]: a linear decoder (nn.Parameter, its own optimizer group); initialised from an
  uncentred PCA of the teacher features, or from the training-free lift
  (:func:`rh3dgs.lifting.lift`), by :meth:`initialize_semantics` (called by the pipeline).
* Rendering: the latents are composited in the same pass as RGB (:meth:`render_features`);
  outputs gain ``latents`` [H, W, d]; in eval ``semantics`` (false colours) and the viewer's
  ``relevancy_<i>`` / ``composited`` (:class:`rh3dgs.nerfstudio.viewer.TextQueryPanel`); in
  training ``semantic_step``: the step's :class:`SemanticStep` (the loss inputs, made once).
* Losses (:meth:`semantic_losses`): ``lambda_sem * ramp(step) * L_VFM`` (VCD weights from A, D1, D2
  and the teacher map's edges; delta annealed from the semantic start step) + ``lambda_con * L_LIC``
  (on the latents, after ``lic.warmup_steps``).
* Metrics: ``sem_cos`` / ``sem_cos_vcd``, in training only on the steps the trainer logs.

``semantics=False`` in the config builds :class:`SplatfactoCPUModel` itself (splatfacto on rh3dgs's
rasterizer: the CPU baseline of ``benchmarks/bench_nstrain.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter

from nerfstudio.utils.rich_utils import CONSOLE

from ..cameras import Cameras
from ..errors import ConfigError
from ..lic import LICConfig, LICLoss
from ..query import TEMPERATURE
from ..teachers.maps import prepare_map
from ..vcd import VCDConfig, reliability_weights
from ..vfm import VFMConfig, vfm_loss
from .splatfacto_cpu import SplatfactoCPUModel, SplatfactoCPUModelConfig, ViewRender

__all__ = ["Rh3dgsModelConfig", "Rh3dgsModel", "SemanticStep", "SemanticTargets"]


def _area_resize(t: Tensor, size: Tuple[int, int]) -> Tensor:
    """[B, H, W, C] -> [B, h, w, C] by area averaging (linear: exact for composited sums)."""
    if tuple(t.shape[1:3]) == tuple(size):
        return t
    return F.adaptive_avg_pool2d(t.permute(0, 3, 1, 2), size).permute(0, 2, 3, 1)


def _bilinear_resize(t: Tensor, size: Tuple[int, int]) -> Tensor:
    """[H, W, C] -> [h, w, C] bilinear (masks; teacher maps go through :func:`prepare_map`)."""
    if tuple(t.shape[:2]) == tuple(size):
        return t
    return F.interpolate(t.permute(2, 0, 1)[None].float(), size=size, mode="bilinear",
                         align_corners=False)[0].permute(1, 2, 0)


@dataclass
class Rh3dgsModelConfig(SplatfactoCPUModelConfig):
    """Splatfacto + Rh-3DGS semantic distillation (VCD + VFM + LIC)."""

    _target: Type = field(default_factory=lambda: Rh3dgsModel)
    semantics: bool = True
    """False: build plain splatfacto on rh3dgs's rasterization path (:class:`SplatfactoCPUModel`): no latents,
    decoder, teacher maps, semantic losses or metrics (lambda_sem, lambda_con, latent_dim... are then unused)."""
    latent_dim: int = 16
    """d: per-Gaussian semantic latent size."""
    latent_init_std: float = 0.1
    """Std of the random latent initialisation (when not initialised from the lift)."""
    decoder_init: Literal["pca", "lift", "random"] = "pca"
    """'pca': uncentred PCA of sampled teacher features; 'lift': run the training-free lift on the
    initial Gaussians (latents and decoder from it); 'random': orthonormal random decoder."""
    pca_max_pixels: int = 200_000
    """Teacher pixels sampled for the PCA decoder initialisation."""
    lambda_sem: float = 0.1
    """Weight of L_VFM."""
    semantic_start_step: int = 0
    """No semantic loss before this step."""
    semantic_warmup_steps: int = 500
    """Linear ramp of lambda_sem over this many steps after semantic_start_step."""
    semantic_max_pixels: int = 65536
    """The semantic loss is computed on at most this many pixels: larger renders are area-pooled
    (latents and statistics are composited sums, so pooling is exact up to the decode)."""
    semantic_min_coverage: float = 0.0
    """Pixels with accumulated opacity below this are left out of the semantic loss."""
    vfm: VFMConfig = field(default_factory=lambda: VFMConfig(anneal_steps=10000))
    """VFM settings (delta annealing counts from semantic_start_step)."""
    use_vcd: bool = True
    """Weight the VFM loss by VCD reliability weights (False: uniform)."""
    vcd: VCDConfig = field(default_factory=VCDConfig)
    """VCD settings."""
    lambda_con: float = 0.05
    """Weight of L_LIC (0 = off)."""
    lic: LICConfig = field(default_factory=lambda: LICConfig(warmup_steps=5000, refresh_every=500, num_anchors=512))
    """LIC settings (warmup_steps = the LIC start step); computed on the latents."""
    semantic_eval_metrics: bool = True
    """Report mean teacher cosine (and its VCD-weighted version) in eval metrics."""

    def setup(self, **kwargs):
        """The model: :class:`Rh3dgsModel`, or with ``semantics=False`` :class:`SplatfactoCPUModel`."""
        return (self._target if self.semantics else SplatfactoCPUModel)(self, **kwargs)


def semantic_size(size: Tuple[int, int], max_pixels: int) -> Tuple[int, int]:
    """Render size (H, W) -> the semantic loss resolution: the same aspect, at most ``max_pixels`` pixels."""
    H, W = int(size[0]), int(size[1])
    s = max(1.0, math.sqrt(H * W / max(1, max_pixels)))
    return max(1, int(H / s)), max(1, int(W / s))


@dataclass
class SemanticTargets:
    """The batch's side of one view's semantic loss, at the loss resolution, without graph.

    teacher [1, h, w, D] unit rows (zero: no feature); valid [1, h, w] bool (teacher present, the
    batch's mask, ``semantic_min_coverage``); weights [1, h, w] the VCD weights w_bar (``valid``
    as float with ``use_vcd=False``).
    """

    teacher: Tensor
    valid: Tensor
    weights: Tensor


class SemanticStep:
    """The semantic loss inputs of one rendered view at the loss resolution, made once per step.

    Made from the render outputs (in training by ``get_outputs``): latents [1, h, w, d] and the
    statistics A, D1, D2 [1, h, w], area-pooled to at most ``semantic_max_pixels`` (composited sums:
    pooling is exact up to the decode), with their graph. :meth:`targets` adds the batch's side
    (:class:`SemanticTargets`, no graph) once, for whichever of the loss and the metrics asks first:
    both get the same tensors, whatever their order.
    """

    def __init__(self, outputs: Dict[str, Tensor], cfg: Rh3dgsModelConfig) -> None:
        size = semantic_size(outputs["latents"].shape[:2], cfg.semantic_max_pixels)
        lat, A, D1, D2 = (_area_resize(outputs[k][None], size)
                          for k in ("latents", "accumulation", "depth_m1", "depth_m2"))
        self.latents, self.alpha, self.d1, self.d2 = lat, A[..., 0], D1[..., 0], D2[..., 0]
        self.size = size
        self.cfg = cfg
        self._targets: Optional[Tuple[Tensor, SemanticTargets]] = None

    @torch.no_grad()
    def targets(self, batch: Dict[str, Tensor]) -> SemanticTargets:
        """Teacher map at the loss resolution, valid mask and VCD weights for ``batch`` (computed once).

        ``batch["teacher"]`` is used as handed when it is at the loss resolution (the data manager
        prepares it there, once per camera: unit rows); other sizes go through :func:`prepare_map`.
        """
        src = batch["teacher"]
        if self._targets is not None and self._targets[0] is src:
            return self._targets[1]
        cfg, dev = self.cfg, self.latents.device
        t = src.to(dev)
        teacher = (t if tuple(t.shape[:2]) == self.size else prepare_map(t, self.size))[None]
        valid = teacher.norm(dim=-1) > 0.5
        if cfg.semantic_min_coverage > 0:
            valid = valid & (self.alpha >= cfg.semantic_min_coverage)
        if "mask" in batch:
            m = batch["mask"].to(dev).float()
            valid = valid & (_bilinear_resize(m, self.size)[..., 0] > 0.5)[None]
        if cfg.use_vcd:
            w = reliability_weights(self.alpha, self.d1, self.d2, features=teacher, cfg=cfg.vcd, valid_mask=valid)
        else:
            w = valid.float()
        out = SemanticTargets(teacher, valid, w)
        self._targets = (src, out)
        return out


class Rh3dgsModel(SplatfactoCPUModel):
    """Splatfacto (CPU-safe) with per-Gaussian semantic latents (see module docstring)."""

    config: Rh3dgsModelConfig

    # ------------------------------------------------------------------ setup
    def populate_modules(self):
        cfg = self.config
        if cfg.latent_dim < 1:
            raise ConfigError(f"rh3dgs: latent_dim must be >= 1, got {cfg.latent_dim}")
        super().populate_modules()
        gen = torch.Generator().manual_seed(0)
        self.gauss_params["latents"] = Parameter(
            torch.randn(self.num_points, cfg.latent_dim, generator=gen) * cfg.latent_init_std)
        # decoder [D, d]; D is only known from the teacher: a placeholder until
        # initialize_semantics() (or load_state_dict) sets the real one.
        D = int((self.kwargs.get("metadata") or {}).get("rh3dgs_teacher_dim", cfg.latent_dim))
        dec = torch.randn(D, cfg.latent_dim, generator=gen)
        self.decoder = Parameter(torch.linalg.qr(dec)[0] if D >= cfg.latent_dim else dec)
        self.semantics_initialized = False
        self.lic_loss = LICLoss(cfg.lic)
        self.metrics_every = 1
        """Training steps between semantic metrics: the trainer's ``logging.steps_per_log``
        (set by :meth:`get_training_callbacks`)."""
        # text-query elements for nerfstudio's viewer (no parameters; see rh3dgs/nerfstudio/viewer.py)
        from .viewer import TextQueryPanel

        self.text_query = TextQueryPanel(self)

    @property
    def latents(self) -> Tensor:
        return self.gauss_params["latents"]

    @property
    def teacher_dim(self) -> int:
        return int(self.decoder.shape[0])

    def load_state_dict(self, dict, **kwargs):  # type: ignore
        """The base class's (Parameter objects kept), with the decoder resized to the checkpoint's."""
        if "decoder" in dict and tuple(dict["decoder"].shape) != tuple(self.decoder.shape):
            self.decoder.data = torch.zeros(dict["decoder"].shape, device=self.decoder.device)
        self.semantics_initialized = True
        return super().load_state_dict(dict, **kwargs)

    @torch.no_grad()
    def initialize_semantics(self, teacher_maps: Sequence[Tensor], cameras: Optional[Cameras] = None) -> None:
        """Set the decoder (and with ``decoder_init='lift'`` the latents) from teacher maps.

        Args:
            teacher_maps: per training view [h, w, D] unit teacher features (any resolution).
            cameras: rh3dgs cameras of those views at the image size (needed for 'lift').
        """
        from ..lifting import LiftConfig, lift, pca_decoder

        cfg = self.config
        if len(teacher_maps) == 0:
            raise ConfigError("rh3dgs: no teacher maps to initialise the semantic decoder from")
        D = int(teacher_maps[0].shape[-1])
        d = cfg.latent_dim
        dev = self.means.device
        if cfg.decoder_init == "lift" and cameras is not None:
            g = self.gaussians_for_render(detach=True)
            res = lift(g, cameras.to(dev), list(teacher_maps),
                       LiftConfig(latent_dim=d, vcd=cfg.vcd), progress=False)
            dec = torch.zeros(D, d, device=dev)
            dec[:, : res.decoder.shape[1]] = res.decoder.to(dev)
            lat = torch.zeros(len(g), d, device=dev)
            lat[:, : res.latents.shape[1]] = res.latents.to(dev)
            # Gaussians the lift could not see keep a small random latent
            inval = ~res.valid.to(dev)
            lat[inval] = self.latents.data[inval]
            self.gauss_params["latents"] = Parameter(lat)
            self.decoder = Parameter(dec)
            CONSOLE.log(f"rh3dgs: latents and decoder initialised by the lift ({res.info['valid']}/{len(g)} "
                        f"Gaussians seen, {res.info['seconds']:.1f}s)")
        elif cfg.decoder_init in ("pca", "lift"):
            per_view = max(1, cfg.pca_max_pixels // len(teacher_maps))
            gen = torch.Generator().manual_seed(0)
            samples = []
            for m in teacher_maps:
                flat = m.reshape(-1, D).float().cpu()
                if flat.shape[0] > per_view:
                    flat = flat[torch.randperm(flat.shape[0], generator=gen)[:per_view]]
                samples.append(flat)
            feats = F.normalize(torch.cat(samples), dim=-1)
            basis, _ = pca_decoder(feats, torch.ones(feats.shape[0]), d)
            dec = torch.zeros(D, d)
            dec[:, : basis.shape[1]] = basis
            if basis.shape[1] < d:  # D < d: remaining columns random
                dec[:, basis.shape[1]:] = torch.randn(D, d - basis.shape[1], generator=gen) * 0.1
            self.decoder = Parameter(dec.to(dev))
            # start every latent at the dominant (mean) teacher direction plus noise
            mean_dir = F.normalize(feats.mean(0), dim=0) @ dec
            self.gauss_params["latents"] = Parameter(
                (mean_dir.to(dev)[None] + self.latents.data).contiguous())
        else:
            gen = torch.Generator().manual_seed(0)
            q = torch.linalg.qr(torch.randn(max(D, d), d, generator=gen))[0][:D]
            self.decoder = Parameter(q.to(dev))
        self.semantics_initialized = True

    def get_training_callbacks(self, training_callback_attributes):
        """splatfacto's callbacks; reads the trainer's logging period for :meth:`get_metrics_dict`."""
        trainer = training_callback_attributes.trainer
        if trainer is not None:
            self.metrics_every = max(1, int(trainer.config.logging.steps_per_log))
        return super().get_training_callbacks(training_callback_attributes)

    def get_gaussian_param_groups(self) -> Dict[str, List[Parameter]]:
        return {**super().get_gaussian_param_groups(), "latents": [self.gauss_params["latents"]]}

    def get_param_groups(self) -> Dict[str, List[Parameter]]:
        return {**super().get_param_groups(), "decoder": [self.decoder]}

    # ------------------------------------------------------------------ rendering
    def render_features(self, gaussians) -> Optional[Tensor]:
        return gaussians.latents  # composited with RGB in one pass

    def view_outputs(self, view: ViewRender) -> Dict[str, Tensor]:
        out = super().view_outputs(view)
        out["latents"] = view.result.features.squeeze(0)  # [H, W, d]
        if self.training:
            out["semantic_step"] = SemanticStep(out, self.config)
        else:
            out["semantics"] = self.semantic_colors(out["latents"])
            # viewer: relevancy_<i> and composited while a text query is set (empty otherwise)
            out.update(self.text_query.outputs(out, view.gaussians, view.cameras, view.crop_ids))
        return out

    def empty_outputs(self, width: int, height: int) -> Dict[str, Tensor]:
        out = super().empty_outputs(width, height)
        out["latents"] = self.background_color.new_zeros(height, width, self.config.latent_dim)
        return out

    def semantic_step(self, outputs: Dict[str, Tensor]) -> SemanticStep:
        """The step's :class:`SemanticStep`: the one ``get_outputs`` made in training, else one from ``outputs``."""
        step = outputs.get("semantic_step")
        return step if isinstance(step, SemanticStep) else SemanticStep(outputs, self.config)

    def semantic_size(self, size: Tuple[int, int]) -> Tuple[int, int]:
        """Render size (H, W) -> the semantic loss resolution (``semantic_max_pixels``)."""
        return semantic_size(size, self.config.semantic_max_pixels)

    # ------------------------------------------------------------------ semantics
    def decode(self, latents: Tensor) -> Tensor:
        """[..., d] -> [..., D] unit teacher-space features."""
        return F.normalize(latents @ self.decoder.T, dim=-1)

    @torch.no_grad()
    def semantic_colors(self, latents: Tensor) -> Tensor:
        """[H, W, d] -> [H, W, 3] false colours (decoded features on the decoder's top-3 axes)."""
        return self._false_colors(self.decode(latents.float()))

    @torch.no_grad()
    def _false_colors(self, feats: Tensor) -> Tensor:
        """[H, W, D] teacher-space features -> [H, W, 3] on the decoder's top-3 axes, in [0, 1]."""
        U = torch.linalg.svd(self.decoder.detach().float(), full_matrices=False)[0][:, :3]  # [D, <=3]
        z = feats @ U
        if z.shape[-1] < 3:
            z = F.pad(z, (0, 3 - z.shape[-1]))
        return (z * 0.5 + 0.5).clamp(0, 1)

    def semantic_field(self):
        from ..field import SemanticField

        return SemanticField(self.latents.detach(), self.decoder.detach())

    @torch.no_grad()
    def relevancy_outputs(self, outputs: Dict[str, Tensor], positives: Tensor, negatives: Optional[Tensor] = None,
                          temperature: float = TEMPERATURE) -> Dict[str, Tensor]:
        """Viewer hook: rendered latents -> ``relevancy_<i>`` maps [H, W, 1] in [0, 1].

        Args:
            outputs: :meth:`get_outputs` result (needs ``latents`` [H, W, d]).
            positives: [Q, D] unit text embeddings (teacher space); negatives: [J, D] or None.
        Uses the linear fast path (:meth:`rh3dgs.field.SemanticField.relevancy`).
        """
        fld = self.semantic_field()
        lat = outputs["latents"].float()
        pos = positives.to(lat.device).float()
        neg = negatives.to(pos) if negatives is not None else pos.new_zeros(0, pos.shape[-1])
        rel = fld.relevancy(lat, pos, neg, temperature)
        return {f"relevancy_{i}": rel[..., i: i + 1] for i in range(rel.shape[-1])}

    # ------------------------------------------------------------------ losses and metrics
    def losses(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        loss_dict = super().losses(outputs, batch, metrics_dict)
        if "teacher" in batch and "latents" in outputs:
            loss_dict.update(self.semantic_losses(outputs, batch))
        return loss_dict

    def semantic_losses(self, outputs, batch) -> Dict[str, Tensor]:
        """The semantic loss terms of one step (the model's whole semantic objective).

        ``vfm_loss`` = lambda_sem * ramp(step) * L_VFM(decoded pooled latents, teacher; VCD weights
        w_bar, delta annealed from ``semantic_start_step``), the ramp linear over
        ``semantic_warmup_steps``; ``lic_loss`` = lambda_con * L_LIC(latents) from ``lic.warmup_steps``
        (training only).
        """
        cfg = self.config
        losses: Dict[str, Tensor] = {}
        since = self.step - cfg.semantic_start_step
        if since < 0:
            ramp = 0.0
        elif cfg.semantic_warmup_steps > 0:
            ramp = min(1.0, (since + 1) / cfg.semantic_warmup_steps)
        else:
            ramp = 1.0
        if cfg.lambda_sem * ramp > 0:
            step = self.semantic_step(outputs)
            t = step.targets(batch)
            l_vfm, _ = vfm_loss(step.latents @ self.decoder.T, t.teacher, t.weights, max(0, since), cfg.vfm)
            losses["vfm_loss"] = cfg.lambda_sem * ramp * l_vfm
        if cfg.lambda_con > 0 and self.training and self.step >= cfg.lic.warmup_steps:
            losses["lic_loss"] = cfg.lambda_con * self.lic_loss(self.latents, self.step, means=self.means.detach())
        return losses

    @torch.no_grad()
    def semantic_metrics(self, step: SemanticStep, batch) -> Dict[str, Tensor]:
        """``sem_cos``: mean cosine of decoded rendered features to the teacher on valid pixels the
        scene covers (A >= 0.5); ``sem_cos_vcd``: the same weighted by the VCD weights w_bar."""
        t = step.targets(batch)
        cos = (self.decode(step.latents.detach()) * t.teacher).sum(-1)
        v = (t.valid & (step.alpha.detach() >= 0.5)).float()  # pixels the scene covers
        return {"sem_cos": (cos * v).sum() / v.sum().clamp_min(1.0),
                "sem_cos_vcd": (cos * t.weights).sum() / t.weights.sum().clamp_min(1e-12)}

    def get_metrics_dict(self, outputs, batch) -> Dict[str, Tensor]:
        """splatfacto's; plus the semantic metrics (in training only on the steps the trainer logs)."""
        metrics = super().get_metrics_dict(outputs, batch)
        logged = not self.training or self.step % self.metrics_every == 0
        if logged and "teacher" in batch and "latents" in outputs:
            metrics.update(self.semantic_metrics(self.semantic_step(outputs), batch))
        return metrics

    def get_image_metrics_and_images(self, outputs, batch):
        metrics, images = super().get_image_metrics_and_images(outputs, batch)
        if self.config.semantic_eval_metrics and "teacher" in batch and "latents" in outputs:
            sem = self.semantic_metrics(self.semantic_step(outputs), batch)
            metrics.update({k: float(v) for k, v in sem.items()})
            H, W = outputs["latents"].shape[:2]
            t = prepare_map(batch["teacher"].to(self.device), (H, W))
            images["semantics"] = torch.cat([self._false_colors(t), self.semantic_colors(outputs["latents"])], dim=1)
        return metrics, images
