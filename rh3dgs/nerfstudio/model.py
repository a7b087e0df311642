"""``Rh3dgsModel``: :class:`SplatfactoNativeModel` + per-Gaussian semantic latents trained with :mod:`rh3dgs.method.objective`.

The CPU-safe splatfacto is :mod:`rh3dgs.nerfstudio.splatfacto_native`; this model is that class plus
(as nerfstudio-method-template's ``populate_modules(): super().populate_modules()``):

* ``gauss_params["latents"]`` [N, d]: beside means / scales / ... so that the densification
  strategy (gsplat's ``DefaultStrategy``, which duplicates / splits / removes *every* entry of the
  params dict together with its optimizer state) carries it.
* ``decoder`` [D, d]: the linear decoder (nn.Parameter, optimizer group ``decoder``; learning rate 0
  in the presets: kept as the lift's basis, as ``distill()``'s ``decoder_lr = 0``).
* ``objective``: the one semantic objective (:class:`rh3dgs.method.objective.SemanticObjective`, the
  objective of ``distill()`` too) with its background latent (optimizer group ``background_latent``)
  and its LIC state. ``Rh3dgsModelConfig.objective`` is an :class:`~rh3dgs.method.objective.ObjectiveConfig`
  with the same defaults as ``DistillConfig.objective``.
* Initialisation (:meth:`initialize_semantics`, called by the pipeline): latents and decoder from the
  training-free lift of the training views on the initial Gaussians (:func:`rh3dgs.lifting.initial_field`,
  with ``lift``: the same :class:`~rh3dgs.lifting.LiftConfig` as ``distill()``); ``init="random"``:
  random latents and an orthonormal random decoder. Gaussians the lift leaves without a feature keep a
  zero latent, which stays zero (no gradient), as in ``distill()``.
* Rendering: the latents as the objective renders them (unit rows with ``spherical_latents``) are
  composited in the same pass as RGB; outputs gain ``latents`` [H, W, d]; in eval ``semantics`` (false
  colours) and the viewer's ``relevancy_<i>`` / ``composited`` (:class:`rh3dgs.nerfstudio.viewer.TextQueryPanel`).
  With ``spherical_latents`` the stored latents are put on the unit sphere at initialisation and back on
  it after every optimizer step (a no-op for the loss, which normalises them anyway), so the field,
  checkpoints and exports hold the latents as rendered.
* Losses: ``semantic_loss`` = the objective's pixel term on the render and ``batch["teacher"]`` (at the
  teacher's resolution by default), ``lic_loss`` = its LIC term (training only, from its start step).
* Metrics: ``sem_cos`` / ``sem_cos_vcd`` on what the objective compares, in training only on the steps
  the trainer logs.
* Geometry: by default (``semantic_geometry_grad=False``) only the RGB loss shapes the Gaussians, as in
  splatfacto; the semantic loss trains the latents on that geometry (``distill()``'s problem on moving
  Gaussians), and its channels' share of the rasterizer's alpha gradient is never computed.
* Selection (``objective.selection``, :mod:`rh3dgs.method.selection`, the criterion of ``distill()``): the check
  views' batches carry no teacher map (they train RGB only); every ``check_every`` steps the field's check loss is
  measured on them, the latents of the lowest kept while the Gaussians stay the same ones (after densification
  ends), and after the last step the model holds the field that function chooses against the lifts of the Gaussians
  as they are then (a resumed run measures from where it resumed). Training starts from the lift of the views that
  are not check views (the selection's reference; Gaussians only check views see keep the lift of every view).
* ``freeze_geometry``: only the semantic parts train (no gradient to means / scales / quats / opacities,
  no densification): ``distill()``'s problem, on the model's Gaussians (e.g. a trained splatfacto's).

Plain splatfacto on rh3dgs's rasterizer (the CPU baseline of ``benchmarks/bench_nstrain.py``) is its own method,
``ns-train splatfacto-native`` / ``splatfacto-native-lite`` (:class:`SplatfactoNativeModelConfig`); this config's
``semantics=False``, kept for the runs and scripts written with it, makes its ``_target`` that model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Dict, List, Literal, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter

from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackAttributes, TrainingCallbackLocation
from nerfstudio.utils.rich_utils import CONSOLE

from ..cameras import Cameras
from ..errors import ConfigError
from ..ranges import Range
from ..lifting import LiftConfig, initial_field
from ..method.objective import ObjectiveConfig, SemanticObjective, teacher_grid
from ..method.selection import CheckViews, apply_decisions, check_view_indices, fit_lift, lift_latents
from ..rendering import fixed_views
from ..query import TEMPERATURE
from ..teachers.maps import prepare_map, region_fraction
from .splatfacto_native import SplatfactoNativeModel, SplatfactoNativeModelConfig, ViewRender

__all__ = ["Rh3dgsModelConfig", "Rh3dgsModel", "GEOMETRY_GROUPS"]

GEOMETRY_GROUPS = ("means", "scales", "quats", "opacities")
"""The parameter groups ``freeze_geometry`` keeps fixed."""


@dataclass
class Rh3dgsModelConfig(SplatfactoNativeModelConfig):
    """Splatfacto + the Rh-3DGS semantic objective (:class:`rh3dgs.method.objective.ObjectiveConfig`)."""

    _target: Type = field(default_factory=lambda: Rh3dgsModel)
    semantics: bool = True
    """Off: build plain splatfacto (as ns-train splatfacto-native does): no latents, teacher maps or losses."""
    latent_dim: Annotated[int, Range(ge=1)] = 16
    """d: per-Gaussian semantic latent size."""
    objective: ObjectiveConfig = field(default_factory=lambda: ObjectiveConfig(lambda_sem=0.1, lambda_con=0.03))
    """The semantic objective of distill(), weighted 0.1 against the RGB loss (docs/method.md, section 7)."""
    semantic_geometry_grad: bool = False
    """Let the semantic loss move the Gaussians' geometry (off: RGB alone shapes it)."""
    semantic_steps: Optional[Annotated[int, Range(ge=1)]] = None
    """Steps the objective's schedules span (None: the trainer's max_num_iterations)."""
    init: Literal["lift", "random"] = "lift"
    """lift: latents and decoder from the lift of the training views; random: N(0, init_scale^2) latents."""
    lift: LiftConfig = field(default_factory=LiftConfig)
    """Settings of the lift of init lift (its latent_dim is latent_dim's)."""
    init_scale: Annotated[float, Range(gt=0)] = 0.1
    """Std of the random initial latents (init random)."""
    freeze_geometry: bool = False
    """Train only latents, decoder, background latent and colours, on fixed geometry (no densification)."""
    semantic_eval_metrics: bool = True
    """Report the mean teacher cosine (and its VCD-weighted version) in the eval metrics."""

    def __post_init__(self) -> None:
        super().__post_init__()  # the numeric fields against their declared ranges (rh3dgs.ranges)
        # the model this config builds (setup() builds _target): semantics off is plain splatfacto
        if not self.semantics:
            self._target = SplatfactoNativeModel
        elif self._target is SplatfactoNativeModel:  # dataclasses.replace(semantics=True) of an "off" config
            self._target = Rh3dgsModel

    def __setstate__(self, state) -> None:
        """A config read back from a run's config.yml (nerfstudio's ``yaml.Loader``) builds what it was written
        with: a run written with ``semantics: false`` names ``Rh3dgsModel`` as its ``_target``."""
        self.__dict__.update(state)
        self.__post_init__()


class Rh3dgsModel(SplatfactoNativeModel):
    """Splatfacto (CPU-safe) with per-Gaussian semantic latents (see module docstring)."""

    config: Rh3dgsModelConfig

    # ------------------------------------------------------------------ setup
    def populate_modules(self):
        cfg = self.config  # its numbers are in their declared ranges (rh3dgs.ranges, checked on construction)
        super().populate_modules()
        gen = torch.Generator().manual_seed(0)
        d = cfg.latent_dim
        self.gauss_params["latents"] = Parameter(torch.randn(self.num_points, d, generator=gen) * cfg.init_scale)
        # decoder [D, d]; D is only known from the teacher: a placeholder until
        # initialize_semantics() (or load_state_dict) sets the real one.
        D = int((self.kwargs.get("metadata") or {}).get("rh3dgs_teacher_dim", d))
        self.decoder = Parameter(self._random_decoder(D, d, gen))
        # schedules over splatfacto's 30k steps until the trainer gives the run's length (get_training_callbacks)
        self.objective = SemanticObjective(cfg.objective, d, cfg.semantic_steps or 30000)
        self.semantics_initialized = False
        self.geometry_version = 0
        """Incremented when densification replaces the Gaussians (a kept semantic state no longer fits them)."""
        self._check_inputs: Optional[Tuple[Cameras, List[Tensor], List[int]]] = None
        self._checks: Optional[CheckViews] = None
        self._last_step, self._steps = -1, 0
        self.selection_info: Dict[str, object] = {}
        """What the selection decided at the end of training (:func:`rh3dgs.method.selection.select_field`)."""
        self.metrics_every = 1
        """Training steps between semantic metrics: the trainer's ``logging.steps_per_log``
        (set by :meth:`get_training_callbacks`)."""
        # text-query elements for nerfstudio's viewer (no parameters; see rh3dgs/nerfstudio/viewer.py)
        from .viewer import TextQueryPanel

        self.text_query = TextQueryPanel(self)

    @staticmethod
    def _random_decoder(D: int, d: int, gen: torch.Generator) -> Tensor:
        """[D, d] with orthonormal columns (D >= d), else Gaussian."""
        dec = torch.randn(max(D, d), d, generator=gen)
        return torch.linalg.qr(dec)[0][:D] if D >= d else dec[:D]

    def set_semantic_steps(self, steps: int) -> None:
        """Span the objective's schedules over ``steps`` (the background latent, a parameter, is kept)."""
        obj = SemanticObjective(self.config.objective, self.config.latent_dim, int(steps))
        obj.background = self.objective.background
        self.objective = obj

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
        dict.setdefault("objective.background", torch.zeros_like(self.objective.background))  # runs before it
        self.semantics_initialized = True
        if self.objective.lic is not None:  # other Gaussians in the same Parameter objects
            self.objective.lic.invalidate()
        return super().load_state_dict(dict, **kwargs)

    def step_post_backward(self, step):
        """splatfacto's densification (gsplat's strategy), then LIC's graph marked for rebuilding when the strategy
        changed the Gaussians: its duplicate / split / remove put new Parameters in ``gauss_params``, and a step that
        adds as many as it prunes keeps N, which :meth:`rh3dgs.method.lic.LICLoss.needs_refresh` alone would not notice."""
        means = self.gauss_params["means"]
        super().step_post_backward(step)
        if self.gauss_params["means"] is not means:
            self.geometry_version += 1
            if self.objective.lic is not None:
                self.objective.lic.invalidate()

    @torch.no_grad()
    def initialize_semantics(self, teacher_maps: Sequence[Tensor], cameras: Optional[Cameras] = None) -> None:
        """Latents and decoder from the teacher maps of the training views (``init``: the lift, or random).

        Args:
            teacher_maps: per training view [h, w, D] unit teacher features (any resolution).
            cameras: rh3dgs cameras of those views at the image size (``init='lift'``).
        """
        cfg = self.config
        if len(teacher_maps) == 0:
            raise ConfigError("rh3dgs: no teacher maps to initialise the semantic field from")
        D, d, dev = int(teacher_maps[0].shape[-1]), cfg.latent_dim, self.means.device
        lat = torch.zeros(self.num_points, d, device=dev)
        dec = torch.zeros(D, d, device=dev)
        if cfg.init == "lift":
            if cameras is None:
                raise ConfigError("rh3dgs: init='lift' needs the training cameras at one image size (pinhole); "
                                  "this dataset's differ: use --pipeline.model.init random")
            g = self.gaussians_for_render(detach=True)
            lat0, dec0, res = initial_field(g, cameras.to(dev), list(teacher_maps), d, cfg.lift, progress=True)
            lat[:, : lat0.shape[1]] = lat0.to(dev)  # D < d: the lift's latents have D columns
            dec[:, : dec0.shape[1]] = dec0.to(dev)
            if self._check_inputs is not None:  # the selection's start: the lift of the views that are not check views
                fit = fit_lift(g, cameras.to(dev), list(teacher_maps), self._check_inputs[2], replace(cfg.lift, latent_dim=d))
                lat = torch.where(fit.valid.to(dev)[:, None], lift_latents(fit, dec), lat)
            CONSOLE.log(f"rh3dgs: latents and decoder initialised by the lift ({res.info['valid']}/{len(g)} "
                        f"Gaussians with a feature, {res.info['seconds']:.1f}s)")
        else:
            gen = torch.Generator().manual_seed(0)
            dec = self._random_decoder(D, d, gen).to(dev)
            lat = (torch.randn(self.num_points, d, generator=gen) * cfg.init_scale).to(dev)
        self.gauss_params["latents"] = Parameter(self.semantic_latents(lat))  # stored = rendered
        self.decoder = Parameter(dec)
        self.semantics_initialized = True

    def set_check_views(self, cameras: Optional[Cameras], teacher_maps: Sequence[Tensor]) -> List[int]:
        """The objective's check views among the training views (:func:`rh3dgs.method.selection.check_view_indices`),
        kept with every training camera and map for the selection at the end of training; returns their indices
        (the data manager leaves them out of the semantic batches). None of them without cameras of one size."""
        ids = check_view_indices(len(teacher_maps), self.config.objective.selection.check_fraction)
        if ids and cameras is None:
            CONSOLE.log("rh3dgs: the training cameras differ in size: no check views, the last step is kept")
            ids = []
        self._check_inputs = (cameras, list(teacher_maps), ids) if ids else None
        return ids

    def _make_checks(self) -> Optional[CheckViews]:
        if self._check_inputs is None:
            return None
        cams, maps, ids = self._check_inputs
        dev = self.means.device
        check_cams = cams[ids].to(dev)
        teacher = [maps[i].to(dev).float() for i in ids]
        size = (int(cams.height), int(cams.width))
        regions = [region_fraction(t, size).to(dev) for t in teacher] if self.objective.uses_regions else None
        return CheckViews(self.objective, lambda: fixed_views(self.gaussians_for_render(detach=True), check_cams),
                          range(len(ids)), teacher, regions)

    @torch.no_grad()
    def _check(self, step: int) -> None:
        """After each step: the check loss when due, and at the last step the field
        :func:`rh3dgs.method.selection.select_field` chooses (against the lifts of the Gaussians as they are then)."""
        checks = self._checks
        if checks is None or not checks.due(step - (self._last_step - self._steps + 1), self._steps):
            return
        lat = self.semantic_latents(self.latents)
        tag = self.geometry_version
        checks.measure(step, lat, self.objective.background, self.decoder, tag)
        if step != self._last_step:
            return
        cams, maps, ids = self._check_inputs
        g, cams, lift_cfg = self.gaussians_for_render(detach=True), cams.to(self.means.device), self.config.lift
        every = initial_field(g, cams, maps, self.config.latent_dim, lift_cfg)[2]
        lift_all = lift_latents(every, self.decoder)
        fit = fit_lift(g, cams, maps, ids, replace(lift_cfg, latent_dim=self.config.latent_dim))
        reference = torch.where(fit.valid.to(lat.device)[:, None], lift_latents(fit, self.decoder), lift_all)
        out, info = checks.finish(reference, lat, self.objective.background, self.decoder, lift_all, tag)
        info["check_views"] = ids
        if self.config.objective.selection.refit:
            out = self._refit(g, cams, maps, every, info)
        self.gauss_params["latents"].data = out
        self.selection_info = {k: v for k, v in info.items() if k != "revert"}
        CONSOLE.log(f"rh3dgs: check views {info['check_views']}: kept the {info['choice']} field (selected step "
                    f"{info['selected_step']}, {100 * info['fallback_fraction']:.0f} % of the Gaussians back at the lift)")

    def _refit(self, gaussians, cameras: Cameras, maps: List[Tensor], every, info: Dict[str, object]) -> Tensor:
        """The selection's refit (:mod:`rh3dgs.method.selection`) on the Gaussians as they are: ``distill()`` from the
        lift of every view on every view, with this run's learning rates, for as many steps as the check run took to
        its selected field (none when the lift won), the check run's decisions applied. The decoder becomes that
        lift's (the same one when the geometry was frozen)."""
        from ..distill import DistillConfig, distill

        start = self._last_step - self._steps + 1
        steps = 0 if info["choice"] == "lift" else (int(info["selected_step"]) - start if info["selected_step"]
                                                    else self._steps)
        dec = torch.zeros_like(self.decoder)
        dec[:, : every.decoder.shape[1]] = every.decoder.to(dec)
        self.decoder.data = dec
        lift = lift_latents(every, dec)
        if steps <= 0:
            return lift
        lr = {k: float(o.param_groups[0]["lr"]) for k, o in (getattr(self, "optimizers", None) or {}).items()}
        cfg = DistillConfig(steps=steps, views_per_step=1, latent_dim=self.config.latent_dim, lr=lr.get("latents", 2e-3),
                            decoder_lr=lr.get("decoder", 0.0), background_lr=lr.get("background_latent", 0.01),
                            objective=replace(self.config.objective, selection=replace(
                                self.config.objective.selection, check_fraction=0.0)), lift=self.config.lift)
        with torch.enable_grad():
            again = distill(gaussians, cameras, maps, cfg, init_lift=every)
        refitted = torch.zeros_like(lift)
        refitted[:, : again.latents.shape[1]] = again.latents.to(dec)  # D < d: the lift's latents have D columns
        return apply_decisions(info, refitted, lift)

    def teacher_size(self, image_size: Tuple[int, int], teacher_shape: Tuple[int, ...]) -> Tuple[int, int]:
        """The size (h, w) the objective compares a render of ``image_size`` with a teacher map of
        ``teacher_shape`` [h_t, w_t, D] at: the map's grid (``resolution='teacher'``) or the image size."""
        if self.config.objective.resolution == "teacher":
            return teacher_grid(torch.empty(tuple(teacher_shape[:2]) + (0,)), image_size)
        return tuple(image_size)

    def get_training_callbacks(self, training_callback_attributes: TrainingCallbackAttributes):
        """splatfacto's callbacks (without densification with ``freeze_geometry``), plus: the trainer's
        logging period for :meth:`get_metrics_dict`, the run length for the objective's schedules, and
        the latents put back on the unit sphere after each step (``spherical_latents``)."""
        trainer = training_callback_attributes.trainer
        if trainer is not None:
            self.metrics_every = max(1, int(trainer.config.logging.steps_per_log))
            if self.config.semantic_steps is None:
                self.set_semantic_steps(int(trainer.config.max_num_iterations))
            self._steps = int(trainer.config.max_num_iterations)
            self._last_step = int(getattr(trainer, "_start_step", 0)) + self._steps - 1
        cbs = super().get_training_callbacks(training_callback_attributes)
        if self.config.freeze_geometry:  # splatfacto's AFTER_TRAIN_ITERATION callback is the densification
            cbs = [c for c in cbs if TrainingCallbackLocation.AFTER_TRAIN_ITERATION not in c.where_to_run]
        if self.config.objective.spherical_latents:
            cbs.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], self._retract_latents))
        if trainer is not None:
            self._checks = self._make_checks()
            if self._checks is not None:
                cbs.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], self._check))
        return cbs

    @torch.no_grad()
    def _retract_latents(self, step: int) -> None:
        """Stored latents = rendered latents: unit rows (zero rows stay zero)."""
        lat = self.gauss_params["latents"]
        lat.data = self.objective.gaussian_latents(lat.data)

    def get_gaussian_param_groups(self) -> Dict[str, List[Parameter]]:
        groups = super().get_gaussian_param_groups()
        if self.config.freeze_geometry:
            groups = {k: v for k, v in groups.items() if k not in GEOMETRY_GROUPS}
        return {**groups, "latents": [self.gauss_params["latents"]]}

    def get_param_groups(self) -> Dict[str, List[Parameter]]:
        groups = {**super().get_param_groups(), "decoder": [self.decoder]}
        if self.objective.background.requires_grad:
            groups["background_latent"] = [self.objective.background]
        return groups

    def gaussians_for_render(self, crop_ids: Optional[Tensor] = None, detach: bool = False):
        """splatfacto's, with the geometry detached under ``freeze_geometry``."""
        g = super().gaussians_for_render(crop_ids, detach)
        if self.config.freeze_geometry and not detach:
            g.means, g.scales, g.quats, g.opacities = (t.detach() for t in (g.means, g.scales, g.quats, g.opacities))
        return g

    # ------------------------------------------------------------------ rendering
    def semantic_latents(self, raw: Tensor) -> Tensor:
        """Per-Gaussian latents as rendered: the objective's (unit rows with ``spherical_latents``); a zero
        row (a Gaussian without a feature) stays zero and gets no gradient, as in ``distill()``."""
        live = (raw.detach() != 0).any(-1, keepdim=True)
        return self.objective.gaussian_latents(raw) * live

    def render_features(self, gaussians) -> Optional[Tensor]:
        return self.semantic_latents(gaussians.latents)  # composited with RGB in one pass

    @property
    def features_shape_geometry(self) -> bool:
        return self.config.semantic_geometry_grad

    def view_outputs(self, view: ViewRender) -> Dict[str, Tensor]:
        out = super().view_outputs(view)
        out["latents"] = view.result.features.squeeze(0)  # [H, W, d]
        if not self.training:
            out["semantics"] = self.semantic_colors(out["latents"])
            # viewer: relevancy_<i> and composited while a text query is set (empty otherwise)
            out.update(self.text_query.outputs(out, view.gaussians, view.cameras, view.crop_ids))
        return out

    def empty_outputs(self, width: int, height: int) -> Dict[str, Tensor]:
        out = super().empty_outputs(width, height)
        out["latents"] = self.background_color.new_zeros(height, width, self.config.latent_dim)
        return out

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
        """The field (:class:`rh3dgs.field.SemanticField`) on the stored latents, without a copy: they are the
        rendered ones (put on the unit sphere at initialisation and after every step with ``spherical_latents``)."""
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
    def _objective_inputs(self, outputs, batch) -> Tuple[Tensor, ...]:
        """The objective's inputs for one rendered view: latents [1, H, W, d], A, D1, D2 [1, H, W], the decoder,
        teacher [1, h, w, D] (``batch["teacher"]``, with the rows of masked-out cells zeroed), the teacher's
        region fractions [1, H, W] (``batch["teacher_regions"]``, kept per camera by the data manager) or None, and
        the render pixels per cell of the teacher's own map (``batch["teacher_footprint"]``) or None."""
        lat = outputs["latents"][None]
        A, D1, D2 = (outputs[k][None, ..., 0] for k in ("accumulation", "depth_m1", "depth_m2"))
        if not self.config.semantic_geometry_grad:  # the statistics, too, only weight and mask the comparison
            A, D1, D2 = A.detach(), D1.detach(), D2.detach()
        t = batch["teacher"].to(lat.device).float()
        if "mask" in batch:  # nerfstudio's mask (1 = use): teacher cells mostly outside it give no feature
            m = batch["mask"].to(lat.device).float().permute(2, 0, 1)[None]  # [1, 1, H, W]
            keep = F.adaptive_avg_pool2d(m, tuple(t.shape[:2]))[0, 0] >= 0.5
            t = t * keep[..., None]
        regions = batch.get("teacher_regions")
        return (lat, A, D1, D2, self.decoder, t[None], None if regions is None else regions.to(lat.device)[None],
                batch.get("teacher_footprint"))

    def losses(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        loss_dict = super().losses(outputs, batch, metrics_dict)
        if "teacher" in batch and "latents" in outputs:
            loss_dict.update(self.semantic_losses(outputs, batch))
        return loss_dict

    def semantic_losses(self, outputs, batch) -> Dict[str, Tensor]:
        """The objective's terms for one step: ``semantic_loss`` (lambda_sem x the VFM / cosine pixel term) and,
        in training from LIC's start step, ``lic_loss`` (lambda_con x LIC on the Gaussians with a feature)."""
        obj = self.objective
        losses: Dict[str, Tensor] = {}
        if obj.cfg.lambda_sem > 0:
            loss, _ = obj(self.step, *self._objective_inputs(outputs, batch))
            losses["semantic_loss"] = loss
        if self.training and obj.lic is not None and self.step >= obj.lic.cfg.warmup_steps:
            lat = self.latents  # LIC is scale-invariant per row: the stored latents, not their unit rows
            live = torch.nonzero((lat.detach() != 0).any(-1)).flatten()
            subset = None if live.numel() == lat.shape[0] else live  # every Gaussian has a feature: no gather
            # LIC's appearance positives read the colours only when its graph is rebuilt
            due = obj.lic.needs_refresh(self.step, int(live.numel()))
            colors = self.gaussians_for_render(detach=True).base_colors if due else None
            losses["lic_loss"] = obj.lic_loss(self.step, lat, self.decoder, self.means, subset=subset, colors=colors)
        return losses

    @torch.no_grad()
    def semantic_metrics(self, outputs, batch) -> Dict[str, Tensor]:
        """On what the objective compares (:meth:`rh3dgs.method.objective.SemanticObjective.compare`): ``sem_cos``, the
        mean cosine of the decoded render to the teacher on cells the scene covers (pooled A >= 0.5) where the
        teacher gives a feature; ``sem_cos_vcd``: the mean weighted by the objective's pixel weights."""
        lat, A, D1, D2, dec, t, regions, footprint = self._objective_inputs(outputs, batch)
        pred, z, w = self.objective.compare(lat.detach(), A, D1, D2, dec.detach(), t, regions, footprint)
        cos = (F.normalize(pred, dim=-1) * z).sum(-1)
        cover = F.adaptive_avg_pool2d(A[:, None], tuple(z.shape[1:3]))[:, 0] >= 0.5
        v = (cover & (torch.linalg.vector_norm(z, dim=-1) > 0.5)).float()
        return {"sem_cos": (cos * v).sum() / v.sum().clamp_min(1.0),
                "sem_cos_vcd": (cos * w).sum() / w.sum().clamp_min(1e-12)}

    def get_metrics_dict(self, outputs, batch) -> Dict[str, Tensor]:
        """splatfacto's; plus the semantic metrics (in training only on the steps the trainer logs)."""
        metrics = super().get_metrics_dict(outputs, batch)
        logged = not self.training or self.step % self.metrics_every == 0
        if logged and "teacher" in batch and "latents" in outputs:
            metrics.update(self.semantic_metrics(outputs, batch))
        return metrics

    def get_image_metrics_and_images(self, outputs, batch):
        metrics, images = super().get_image_metrics_and_images(outputs, batch)
        if self.config.semantic_eval_metrics and "teacher" in batch and "latents" in outputs:
            sem = self.semantic_metrics(outputs, batch)
            metrics.update({k: float(v) for k, v in sem.items()})
            H, W = outputs["latents"].shape[:2]
            t = prepare_map(batch["teacher"].to(self.device), (H, W))
            images["semantics"] = torch.cat([self._false_colors(t), self.semantic_colors(outputs["latents"])], dim=1)
        return metrics, images
