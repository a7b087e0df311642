"""``SplatfactoNativeModel``: nerfstudio 1.1.5's splatfacto on rh3dgs's rasterizer, on CPU and CUDA alike.

nerfstudio's :class:`~nerfstudio.models.splatfacto.SplatfactoModel` cannot run without CUDA, and
not only because of its rasterizer. This class re-does exactly the methods that stop it, with
splatfacto's names and in splatfacto's order; everything else (the parameter properties, the
k-NN scales, the training callbacks and densification steps, background colours, bilateral grid,
ground truth, ``get_metrics_dict``, ``get_outputs_for_camera``) is splatfacto's own, inherited.
``ns-train splatfacto-native`` (and ``splatfacto-native-lite``, the ``rh3dgs-lite`` schedule) trains it.

=============================================  ==============================================
splatfacto (``models/splatfacto.py``)          what is done here, and why (upstream line numbers)
=============================================  ==============================================
``populate_modules`` (l. 241-332)              re-done: l. 261 ``.cuda()`` on the seed colours;
                                               l. 292-296 build LPIPS eagerly, which downloads
                                               AlexNet
``load_state_dict`` (l. 380-393)               re-done: l. 392 replaces the Parameter objects, so
                                               the optimizers of a ``--load-dir`` resume (built
                                               before loading) would hold stale ones
``get_outputs`` (l. 529-649)                   re-done: l. 578 ``get_viewmat`` is
                                               ``torch.compile``-d (needs a compiler toolchain on
                                               CPU, breaks in the viewer's render thread; here
                                               :func:`viewmat_from_c2w`); l. 579 ``.cuda()``;
                                               l. 599 gsplat's CUDA-only ``rasterization``
``get_loss_dict`` (l. 696-743)                 wrapped: called as it is (:meth:`losses`), behind
                                               the training guards (a NaN / Inf loss or parameter)
``get_image_metrics_and_images`` (l. 758-805)  wrapped: l. 788 / 798 call LPIPS, reported only
                                               where its weights are available
=============================================  ==============================================

:data:`SPLATFACTO_SOURCES` holds the sha256 of each of these upstream functions in nerfstudio
:data:`NERFSTUDIO_VERSION`; ``tests/test_nerfstudio_splatfacto_native.py`` compares them with the
installed nerfstudio, so an upgrade names what to re-copy (as ``rh3dgs/ops/_gsplat.py`` pins gsplat).

What differs on purpose (each said again where it is done):

* ``lpips`` is a lazy property ("auto": only when AlexNet's weights are already in the torch hub
  cache, so nothing is downloaded) and never a submodule (the state dict does not depend on it).
* Rendering is one :func:`rh3dgs.rendering.render` call (rh3dgs's native CPU op on CPU; gsplat's
  projection and CUDA rasterization on CUDA: the device choice is ``rendering``'s, never a CPU
  tensor in a gsplat CUDA op). The strategy's ``info`` (``means2d`` with its gradient, ``radii``,
  ``width``, ``height``, ``n_cameras``) comes from it; densification uses the plain ``means2d``
  gradient (``absgrad`` is a gsplat-rasterizer feature), hence ``use_absgrad=False``.
* Seed points can be subsampled (``max_init_points``); the random initialisation is seeded.
* Training guards: a NaN / Inf loss or parameter stops training with a clear message (or skips
  the batch), before nerfstudio writes another checkpoint.

Extending it, in the style of nerfstudio's method template (which extends nerfacto the same way)::

    @dataclass
    class MyModelConfig(SplatfactoNativeModelConfig):
        _target: Type = field(default_factory=lambda: MyModel)
        # your settings, a one-line docstring each (they are ns-train's --help)

    class MyModel(SplatfactoNativeModel):
        config: MyModelConfig

        def populate_modules(self):
            super().populate_modules()
            # your parameters; an entry of self.gauss_params is densified with the Gaussians

        # override the hooks your method needs:
        # render_features(gaussians)  per-Gaussian channels composited in the same pass as RGB
        # features_shape_geometry     whether those channels' gradients reach the geometry
        # view_outputs(view)          the outputs of one render (empty_outputs: of an empty crop)
        # losses(outputs, batch)      the loss terms (the training guards wrap them)

and register a ``MethodSpecification`` of a ``TrainerConfig`` with it (see :mod:`rh3dgs.nerfstudio.config`).
:class:`rh3dgs.nerfstudio.model.Rh3dgsModel` is this class plus semantic latents, decoder and losses, built so.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Annotated, Dict, List, Literal, Optional, Type, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from gsplat.strategy import DefaultStrategy
from nerfstudio.cameras.cameras import Cameras as NSCameras
from nerfstudio.models.splatfacto import (
    RGB2SH,
    SplatfactoModel,
    SplatfactoModelConfig,
    num_sh_bases,
    random_quat_tensor,
)
from nerfstudio.utils.colors import get_color
from nerfstudio.utils.rich_utils import CONSOLE

from ..cameras import Cameras
from ..errors import ConfigError, NonFiniteError
from ..ranges import Range, check_fields
from ..gaussians import Gaussians
from ..rendering import RenderResult, render

__all__ = ["SplatfactoNativeModelConfig", "SplatfactoNativeModel", "ViewRender", "viewmat_from_c2w",
           "alexnet_weights_available", "NoLPIPS", "NERFSTUDIO_VERSION", "SPLATFACTO_SOURCES"]

NERFSTUDIO_VERSION = "1.1.5"
"""The nerfstudio this module's copies of splatfacto's methods were made from."""

SPLATFACTO_SOURCES = {
    # function of nerfstudio/models/splatfacto.py: (sha256 of its source text in NERFSTUDIO_VERSION, what here
    # depends on it). tests/test_nerfstudio_splatfacto_native.py checks them against the installed nerfstudio.
    "get_viewmat": ("b4d374a3b8cd0e9c", "copied: viewmat_from_c2w"),
    "SplatfactoModel.populate_modules": ("2bedc8501f900747", "copied: SplatfactoNativeModel.populate_modules"),
    "SplatfactoModel.load_state_dict": ("950db6cea5bd9d4d", "copied: SplatfactoNativeModel.load_state_dict"),
    "SplatfactoModel.get_outputs": ("3bf67ddef84ac0a6", "copied: render_camera and view_outputs"),
    "SplatfactoModel.get_loss_dict": ("4aa36e9526212327", "wrapped: SplatfactoNativeModel.losses"),
    "SplatfactoModel.get_image_metrics_and_images": ("fc9f4b938c713c2c",
                                                     "wrapped: its lpips / cc_lpips keys dropped without LPIPS"),
}
"""Upstream function -> (first 16 hex digits of the sha256 of its source, where this module copies or wraps it)."""

LPIPS_ALEXNET_FILE = "alexnet-owt-7be5be79.pth"


def viewmat_from_c2w(c2w: Tensor) -> Tensor:
    """[B, 3, 4] (or [B, 4, 4]) OpenGL camera-to-world -> [B, 4, 4] OpenCV world-to-camera.

    splatfacto's ``get_viewmat`` without its ``torch.compile`` wrapper (same maths).
    """
    R = c2w[:, :3, :3] * torch.tensor([[[1.0, -1.0, -1.0]]], device=c2w.device, dtype=c2w.dtype)
    T = c2w[:, :3, 3:4]
    R_inv = R.transpose(1, 2)
    viewmat = torch.zeros(c2w.shape[0], 4, 4, device=c2w.device, dtype=c2w.dtype)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = R_inv
    viewmat[:, :3, 3:4] = -torch.bmm(R_inv, T)
    return viewmat


class NoLPIPS(torch.nn.Module):
    """Stand-in when LPIPS cannot be built (no AlexNet weights offline): returns NaN."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:  # noqa: D401
        return torch.tensor(float("nan"))


def alexnet_weights_available() -> bool:
    """Whether torchvision's AlexNet weights (LPIPS's backbone) are in the torch hub cache."""
    try:
        hub = torch.hub.get_dir()
    except Exception:  # pragma: no cover
        return False
    return os.path.isfile(os.path.join(hub, "checkpoints", LPIPS_ALEXNET_FILE))


@dataclass
class ViewRender:
    """One camera rendered by :meth:`SplatfactoNativeModel.render_camera` (read by ``view_outputs``).

    camera: the nerfstudio camera; cameras: it as :class:`rh3dgs.Cameras` at the render size
    (``height`` x ``width``, after splatfacto's training downscale); gaussians: what was rendered
    (cropped to ``crop_ids`` when a crop box is set); result: the :class:`rh3dgs.rendering.RenderResult`.
    """

    camera: NSCameras
    cameras: Cameras
    gaussians: Gaussians
    result: RenderResult
    crop_ids: Optional[Tensor]
    width: int
    height: int


@dataclass
class SplatfactoNativeModelConfig(SplatfactoModelConfig):
    """Splatfacto on rh3dgs's rasterizer, on CPU or CUDA (see :mod:`rh3dgs.nerfstudio.splatfacto_native`)."""

    _target: Type = field(default_factory=lambda: SplatfactoNativeModel)
    use_absgrad: bool = False
    """Off: the rasterizer gives the plain means2d gradient (no absgrad)."""
    densify_grad_thresh: Annotated[float, Range(gt=0)] = 0.0002
    """Densification threshold on the plain screen-space gradient (3DGS's value)."""
    max_init_points: Optional[Annotated[int, Range(ge=1)]] = None
    """Subsample the seed point cloud to at most this many points (None: all)."""
    lpips: Literal["auto", "on", "off"] = "auto"
    """auto: LPIPS if torchvision's AlexNet weights are cached (no download); on: always; off: never."""
    skip_nonfinite_batches: bool = False
    """Skip a batch with a NaN / Inf loss instead of stopping (max_skipped_batches in a row)."""
    max_skipped_batches: Annotated[int, Range(ge=0)] = 10
    """Consecutive non-finite batches tolerated with skip_nonfinite_batches."""
    check_params_every: Annotated[int, Range(ge=0)] = 100
    """Every this many steps, stop if a parameter holds NaN / Inf (0: never)."""

    def __post_init__(self) -> None:
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        check_fields(self)  # every numeric field of ours against its declared Range (rh3dgs.ranges)


class SplatfactoNativeModel(SplatfactoModel):
    """nerfstudio's splatfacto on rh3dgs's rasterizer (see module docstring)."""

    config: SplatfactoNativeModelConfig

    # ------------------------------------------------------------------ splatfacto's methods, in its order
    def populate_modules(self):
        """splatfacto's, without ``.cuda()`` (l. 261) or the eager LPIPS (l. 292-296).

        Also: ``max_init_points`` subsampling, a seeded generator for the random parts, k-NN
        distances clamped above 0 (duplicate seed points would get log(0) scales), the strategy
        on the plain gradient (``absgrad=False``), only ``rasterize_mode='classic'``. Builds modules
        only: the viewer's guard is the pipeline's (:class:`rh3dgs.nerfstudio.pipeline.Rh3dgsPipeline`).
        """
        cfg = self.config
        if cfg.rasterize_mode != "classic":
            raise ConfigError("rh3dgs: only rasterize_mode='classic' is supported by the rh3dgs rasterization path")
        gen = torch.Generator().manual_seed(0)
        seed = self.seed_points
        if seed is not None and not cfg.random_init:
            pts = seed[0].float()
            cols = seed[1] if seed[1] is not None and seed[1].shape[0] > 0 else None
            if cfg.max_init_points is not None and pts.shape[0] > cfg.max_init_points:
                keep = torch.randperm(pts.shape[0], generator=gen)[: cfg.max_init_points]
                pts = pts[keep]
                cols = None if cols is None else cols[keep]
        else:
            pts = (torch.rand((cfg.num_random, 3), generator=gen) - 0.5) * cfg.random_scale
            cols = None
        means = Parameter(pts.clone())
        distances, _ = self.k_nearest_sklearn(means.data, 3)
        avg_dist = torch.from_numpy(distances).mean(dim=-1, keepdim=True).clamp_min(1e-7)
        scales = Parameter(torch.log(avg_dist.repeat(1, 3)))
        n = means.shape[0]
        quats = Parameter(random_quat_tensor(n))
        dim_sh = num_sh_bases(cfg.sh_degree)
        if cols is not None:
            rgb = cols.float() / 255.0
            shs = torch.zeros((n, dim_sh, 3))
            if cfg.sh_degree > 0:
                shs[:, 0, :3] = RGB2SH(rgb)
            else:
                shs[:, 0, :3] = torch.logit(rgb, eps=1e-10)
            features_dc = Parameter(shs[:, 0, :])
            features_rest = Parameter(shs[:, 1:, :])
        else:
            features_dc = Parameter(torch.rand(n, 3, generator=gen))
            features_rest = Parameter(torch.zeros((n, dim_sh - 1, 3)))
        opacities = Parameter(torch.logit(0.1 * torch.ones(n, 1)))
        self.gauss_params = torch.nn.ParameterDict({
            "means": means, "scales": scales, "quats": quats, "features_dc": features_dc,
            "features_rest": features_rest, "opacities": opacities})

        self.camera_optimizer = cfg.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")

        from nerfstudio.model_components.lib_bilagrid import BilateralGrid
        from pytorch_msssim import SSIM
        from torchmetrics.image import PeakSignalNoiseRatio

        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self._lpips_module: Optional[torch.nn.Module] = None  # built lazily (property lpips), not a submodule
        self.step = 0
        self.crop_box = None
        if cfg.background_color == "random":
            self.background_color = torch.tensor([0.1490, 0.1647, 0.2157])
        else:
            self.background_color = get_color(cfg.background_color)
        if cfg.use_bilateral_grid:
            self.bil_grids = BilateralGrid(num=self.num_train_data, grid_X=cfg.grid_shape[0],
                                           grid_Y=cfg.grid_shape[1], grid_W=cfg.grid_shape[2])
        self.strategy = DefaultStrategy(
            prune_opa=cfg.cull_alpha_thresh,
            grow_grad2d=cfg.densify_grad_thresh,
            grow_scale3d=cfg.densify_size_thresh,
            grow_scale2d=cfg.split_screen_size,
            prune_scale3d=cfg.cull_scale_thresh,
            prune_scale2d=cfg.cull_screen_size,
            refine_scale2d_stop_iter=cfg.stop_screen_size_at,
            refine_start_iter=cfg.warmup_length,
            refine_stop_iter=cfg.stop_split_at,
            reset_every=cfg.reset_alpha_every * cfg.refine_every,
            refine_every=cfg.refine_every,
            pause_refine_after_reset=self.num_train_data + cfg.refine_every,
            absgrad=False,  # our rasterization path gives means2d.grad, not absgrad
            revised_opacity=False,
            verbose=True,
        )
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)
        self.info: Dict = {}

    @property
    def lpips(self):  # type: ignore[override]
        """splatfacto's ``self.lpips`` (l. 296), built on first use; "auto" only with local weights."""
        if self._lpips_module is None:
            mode = self.config.lpips
            module: torch.nn.Module = NoLPIPS()
            if mode == "on" or (mode == "auto" and alexnet_weights_available()):
                try:
                    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

                    module = LearnedPerceptualImagePatchSimilarity(normalize=True).to(self.device)
                except Exception as e:  # no network / no weights
                    CONSOLE.print(f"[yellow]rh3dgs: LPIPS unavailable ({type(e).__name__}: {e}); not reported")
                    module = NoLPIPS()
            object.__setattr__(self, "_lpips_module", module)
        return self._lpips_module

    def load_state_dict(self, dict, **kwargs):  # type: ignore
        """splatfacto's, keeping the Parameter *objects* (only ``.data`` is resized to the checkpoint's).

        Optimizers built before loading (``ns-train --load-dir`` resumes) thus still hold the
        model's parameters. Every entry of ``gauss_params`` is resized, whatever a subclass adds.
        """
        self.step = 30000  # as splatfacto: eval renders with the full SH degree
        if "means" in dict:  # old checkpoints (splatfacto's remap)
            for p in ["means", "scales", "quats", "features_dc", "features_rest", "opacities"]:
                dict[f"gauss_params.{p}"] = dict[p]
        newp = dict["gauss_params.means"].shape[0]
        for name, param in self.gauss_params.items():
            src = dict.get(f"gauss_params.{name}")
            shape = tuple(src.shape) if src is not None else (newp,) + tuple(param.shape[1:])
            if tuple(param.shape) != shape:
                param.data = torch.zeros(shape, device=param.device, dtype=param.dtype)
        return torch.nn.Module.load_state_dict(self, dict, **kwargs)

    def get_outputs(self, camera: NSCameras) -> Dict[str, Union[Tensor, List]]:
        """splatfacto's, with :meth:`render_camera` for its l. 543-624 and :meth:`view_outputs` for l. 626-649."""
        if not isinstance(camera, NSCameras):
            return {}
        view = self.render_camera(camera)
        if view is None:  # the crop box holds no Gaussian
            return self.empty_outputs(int(camera.width.item()), int(camera.height.item()))
        return self.view_outputs(view)

    # ------------------------------------------------------------------ rendering (get_outputs' stages)
    def gaussians_for_render(self, crop_ids: Optional[Tensor] = None, detach: bool = False) -> Gaussians:
        """The current Gaussians as :class:`rh3dgs.Gaussians` (SH degree in use, optional crop).

        A ``latents`` entry of ``gauss_params`` (added by a subclass) becomes ``Gaussians.latents``.
        """
        p = {k: v for k, v in self.gauss_params.items()}
        if detach:
            p = {k: v.detach() for k, v in p.items()}
        if crop_ids is not None:
            p = {k: v[crop_ids] for k, v in p.items()}
        if self.config.sh_degree > 0:
            deg = min(self.step // self.config.sh_degree_interval, self.config.sh_degree)
            sh0 = p["features_dc"][:, None, :]
            shN = p["features_rest"][:, : num_sh_bases(deg) - 1, :]
        else:
            sh0 = RGB2SH(torch.sigmoid(p["features_dc"]))[:, None, :]
            shN = p["features_dc"].new_zeros(p["features_dc"].shape[0], 0, 3)
        return Gaussians(means=p["means"], scales=p["scales"], quats=p["quats"], opacities=p["opacities"].squeeze(-1),
                         sh0=sh0, shN=shN, latents=p.get("latents"))

    def render_features(self, gaussians: Gaussians) -> Optional[Tensor]:
        """Hook: per-Gaussian features [N, C] composited in the same pass as RGB (None, here: RGB only).

        Their render is ``view.result.features`` in :meth:`view_outputs`."""
        return None

    @property
    def features_shape_geometry(self) -> bool:
        """Hook: whether the gradients of :meth:`render_features`' channels reach the geometry (``render``'s
        option; True here). False: only RGB shapes the Gaussians, and the backward is cheaper."""
        return True

    def render_camera(self, camera: NSCameras) -> Optional[ViewRender]:
        """Render one camera: splatfacto's l. 543-624 on :func:`rh3dgs.rendering.render` (None: empty crop).

        Fills ``self.info`` for the densification strategy and, in training, calls its
        ``step_pre_backward`` (which keeps the ``means2d`` gradient), as splatfacto does.
        """
        if self.training:
            assert camera.shape[0] == 1, "Only one camera at a time"
            c2w = self.camera_optimizer.apply_to_camera(camera)
        else:
            c2w = camera.camera_to_worlds
        if c2w.dim() == 2:
            c2w = c2w[None]
        crop_ids = None
        if self.crop_box is not None and not self.training:
            crop_ids = self.crop_box.within(self.means).squeeze()
            if crop_ids.sum() == 0:
                return None
        scale = self._get_downscale_factor()
        camera.rescale_output_resolution(1 / scale)
        K = camera.get_intrinsics_matrices().to(self.device).reshape(-1, 3, 3)
        W, H = int(camera.width.reshape(-1)[0].item()), int(camera.height.reshape(-1)[0].item())
        self.last_size = (H, W)
        camera.rescale_output_resolution(scale)

        cams = Cameras(viewmats=viewmat_from_c2w(c2w.to(self.device).float()), Ks=K.float(), width=W, height=H)
        g = self.gaussians_for_render(crop_ids)
        res = render(g, cams, self.render_features(g), rgb=True,  # ONE pass: RGB (+ features) + A, D1, D2
                     features_shape_geometry=self.features_shape_geometry)
        means2d = res.projection.means2d
        self.info = {"means2d": means2d, "radii": res.radii, "width": W, "height": H, "n_cameras": 1,
                     "gaussian_ids": None, "depths": res.projection.depths}
        if self.training and means2d.requires_grad:
            self.strategy.step_pre_backward(self.gauss_params, self.optimizers, self.strategy_state, self.step,
                                            self.info)
        return ViewRender(camera, cams, g, res, crop_ids, W, H)

    def view_outputs(self, view: ViewRender) -> Dict[str, Tensor]:
        """Hook: the outputs of one render. Here splatfacto's (l. 626-649): ``rgb`` on the background, ``depth``,
        ``accumulation``, ``background``; and the raw depth moments ``depth_m1`` / ``depth_m2`` [H, W, 1].
        Overrides add to ``super().view_outputs(view)``."""
        res, H, W = view.result, view.height, view.width
        alpha = res.alpha[..., None]  # [1, H, W, 1]
        background = self._get_background_color()
        rgb = torch.clamp(res.rgb + (1 - alpha) * background, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training:
            if view.camera.metadata is not None and "cam_idx" in view.camera.metadata:
                rgb = self._apply_bilateral_grid(rgb, view.camera.metadata["cam_idx"], H, W)
        depth = res.depth[..., None]
        depth = torch.where(alpha > 0, depth, depth.detach().max()).squeeze(0)
        if background.shape[0] == 3 and not self.training:
            background = background.expand(H, W, 3)
        return {"rgb": rgb.squeeze(0), "depth": depth, "accumulation": alpha.squeeze(0), "background": background,
                "depth_m1": res.d1.squeeze(0)[..., None], "depth_m2": res.d2.squeeze(0)[..., None]}

    def empty_outputs(self, width: int, height: int) -> Dict[str, Tensor]:
        """Hook: the outputs when the crop box holds no Gaussian (here splatfacto's ``get_empty_outputs``)."""
        return self.get_empty_outputs(width, height, self.background_color)

    # ------------------------------------------------------------------ losses, guarded
    def get_loss_dict(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        """:meth:`losses` (splatfacto's ``get_loss_dict`` here); in training behind the guards: a NaN / Inf loss
        stops training with a clear message, or skips the batch (``skip_nonfinite_batches``)."""
        if not self.training:
            return self.losses(outputs, batch, metrics_dict)
        self._check_params()
        try:
            loss_dict = self.losses(outputs, batch, metrics_dict)
            bad = [k for k, v in loss_dict.items() if not torch.isfinite(v).all()]
        except NonFiniteError as exc:  # NaN / Inf met inside a loss (e.g. the robust Frechet mean)
            loss_dict, bad = {"main_loss": torch.zeros((), device=self.device)}, [f"loss ({exc})"]
        return self._guard_losses(loss_dict, bad)

    def losses(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        """Hook: the loss terms, which :meth:`get_loss_dict` guards. Here splatfacto's ``get_loss_dict`` (L1 + SSIM,
        scale regularisation); overrides add to ``super().losses(...)``."""
        return super().get_loss_dict(outputs, batch, metrics_dict)

    def _check_params(self) -> None:
        """Every ``check_params_every`` steps: stop if a parameter holds NaN / Inf."""
        every = self.config.check_params_every
        if every <= 0 or self.step % every != 0:
            return
        for name, p in self.named_parameters():
            if not torch.isfinite(p).all():
                name = name.removeprefix("gauss_params.")
                raise NonFiniteError(
                    f"ns-train rh3dgs: parameter '{name}' has {int((~torch.isfinite(p)).sum())} NaN/Inf values at "
                    f"step {self.step}; training stopped. The last saved checkpoint is the last good one: resume "
                    "from it with --load-dir, and lower the learning rates (or lambda_sem / lambda_con).")

    def _guard_losses(self, loss_dict: Dict[str, Tensor], bad: List[str]) -> Dict[str, Tensor]:
        """Training guard: stop on a non-finite loss with a clear message, or skip the batch.

        Raising before nerfstudio's next checkpoint save keeps the last saved (good) checkpoint;
        with ``skip_nonfinite_batches`` a bad batch gets a zero loss (and zero gradients) instead.
        """
        cfg = self.config
        if not bad:
            self._skipped_in_a_row = 0
            return loss_dict
        self._skipped_in_a_row = getattr(self, "_skipped_in_a_row", 0) + 1
        if cfg.skip_nonfinite_batches and self._skipped_in_a_row <= cfg.max_skipped_batches:
            CONSOLE.print(f"[yellow]rh3dgs: non-finite {', '.join(bad)} at step {self.step}: batch skipped "
                          f"({self._skipped_in_a_row} in a row)")
            m2d = self.info.get("means2d") if isinstance(self.info, dict) else None
            if isinstance(m2d, Tensor) and m2d.requires_grad:  # keeps means2d.grad (zero) for the strategy
                zero = (m2d.nan_to_num(0.0) * 0.0).sum()
            else:
                zero = self.means.sum() * 0.0
            return {"main_loss": zero}
        raise NonFiniteError(
            f"ns-train rh3dgs: non-finite {', '.join(bad)} at step {self.step}; training stopped before any "
            "further checkpoint was written, so the last saved checkpoint is the last good one (resume with "
            "--load-dir). Set --pipeline.model.skip-nonfinite-batches True to skip such batches instead.")

    # ------------------------------------------------------------------ eval
    def get_image_metrics_and_images(self, outputs, batch):
        """splatfacto's; ``lpips`` / ``cc_lpips`` left out where LPIPS is unavailable (l. 788 / 798)."""
        metrics, images = super().get_image_metrics_and_images(outputs, batch)
        for key in ("lpips", "cc_lpips"):
            if key in metrics and not math.isfinite(metrics[key]):
                del metrics[key]
        return metrics, images
