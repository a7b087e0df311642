"""``Rh3dgsModel``: splatfacto + per-Gaussian semantic latents, VCD-weighted VFM and LIC.

A subclass of nerfstudio's :class:`SplatfactoModel`; what it changes:

* ``gauss_params["latents"]`` [N, d]: lives beside means / scales / ... so that the
  densification strategy (gsplat's ``DefaultStrategy``, which duplicates / splits /
  removes *every* entry of the params dict together with its optimizer state) carries it.
* ``decoder`` [D, d]: a linear decoder (nn.Parameter, its own optimizer group); initialised
  from an uncentred PCA of the teacher features, or from the training-free lift
  (:func:`rh3dgs.lifting.lift`), by :meth:`initialize_semantics` (called by the pipeline).
* Rendering: ONE :func:`rh3dgs.render` call per camera composites RGB and the latents and
  returns the render statistics A, D1, D2. It runs where the tensors are (rh3dgs's native
  CPU op on CPU; gsplat projection + rh3dgs / gsplat CUDA rasterization on CUDA); no CPU
  tensor ever reaches a gsplat CUDA op. The info dict the strategy reads (``means2d`` with
  its gradient, ``radii``, ``width``, ``height``, ``n_cameras``) is filled from it; densification
  uses the plain means2d gradient (``absgrad`` is a gsplat-rasterizer feature).
* Losses: splatfacto's RGB loss + ``lambda_sem * ramp(step) * L_VFM`` (VCD weights from
  A, D1, D2 and the teacher map's edges; delta annealed from the semantic start step) +
  ``lambda_con * L_LIC`` (on the latents, after ``lic.warmup_steps``).
* CPU safety: no ``.cuda()``; LPIPS is built lazily and only when its AlexNet weights are
  available locally (``lpips="auto"``), and kept out of the state dict; the viewer path
  never calls splatfacto's ``torch.compile``-d ``get_viewmat``.
* ``semantics=False``: none of the above semantic parts (no latents, no decoder in the
  optimizers, no teacher maps, RGB-only render, splatfacto's losses and metrics): splatfacto
  on rh3dgs's rasterizer, the CPU baseline of ``benchmarks/bench_nstrain.py``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn.functional as F
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
from ..gaussians import Gaussians
from ..lic import LICConfig, LICLoss
from ..query import TEMPERATURE
from ..teachers.maps import prepare_map
from ..vcd import VCDConfig, reliability_weights
from ..vfm import VFMConfig, vfm_loss

__all__ = ["Rh3dgsModelConfig", "Rh3dgsModel", "viewmat_from_c2w"]

LPIPS_ALEXNET_FILE = "alexnet-owt-7be5be79.pth"


def viewmat_from_c2w(c2w: Tensor) -> Tensor:
    """[B, 3, 4] (or [B, 4, 4]) OpenGL camera-to-world -> [B, 4, 4] OpenCV world-to-camera.

    Same maths as splatfacto's ``get_viewmat`` without its ``torch.compile`` wrapper (which
    breaks in the viewer's render thread and needs a compiler toolchain on CPU).
    """
    R = c2w[:, :3, :3] * torch.tensor([[[1.0, -1.0, -1.0]]], device=c2w.device, dtype=c2w.dtype)
    T = c2w[:, :3, 3:4]
    R_inv = R.transpose(1, 2)
    viewmat = torch.zeros(c2w.shape[0], 4, 4, device=c2w.device, dtype=c2w.dtype)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = R_inv
    viewmat[:, :3, 3:4] = -torch.bmm(R_inv, T)
    return viewmat


class _NoLPIPS(torch.nn.Module):
    """Stand-in when LPIPS cannot be built (no AlexNet weights offline): returns NaN."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:  # noqa: D401
        return torch.tensor(float("nan"))


def _alexnet_weights_available() -> bool:
    try:
        hub = torch.hub.get_dir()
    except Exception:  # pragma: no cover
        return False
    return os.path.isfile(os.path.join(hub, "checkpoints", LPIPS_ALEXNET_FILE))


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
class Rh3dgsModelConfig(SplatfactoModelConfig):
    """Splatfacto + Rh-3DGS semantic distillation (VCD + VFM + LIC)."""

    _target: Type = field(default_factory=lambda: Rh3dgsModel)
    semantics: bool = True
    """False: plain splatfacto on rh3dgs's rasterization path - no latents, decoder, teacher maps,
    semantic losses or metrics (lambda_sem, lambda_con, latent_dim... are then ignored)."""
    use_absgrad: bool = False
    """The rh3dgs rasterization path provides the plain means2d gradient (no absgrad)."""
    densify_grad_thresh: float = 0.0002
    """Densification threshold on the (plain, not abs) screen-space gradient (3DGS's value)."""
    max_init_points: Optional[int] = None
    """Randomly subsample the seed point cloud to at most this many points (None = all)."""
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
    skip_nonfinite_batches: bool = False
    """On a NaN / Inf loss, skip the batch (zero loss, no update) instead of stopping training;
    training still stops after ``max_skipped_batches`` bad batches in a row."""
    max_skipped_batches: int = 10
    """Consecutive non-finite batches tolerated with ``skip_nonfinite_batches``."""
    check_params_every: int = 100
    """Every this many steps, stop training if a Gaussian parameter or the decoder holds NaN / Inf (0 = never)."""
    vcd: VCDConfig = field(default_factory=VCDConfig)
    """VCD settings."""
    lambda_con: float = 0.05
    """Weight of L_LIC (0 = off)."""
    lic: LICConfig = field(default_factory=lambda: LICConfig(warmup_steps=5000, refresh_every=500, num_anchors=512))
    """LIC settings (warmup_steps = the LIC start step); computed on the latents."""
    lpips: Literal["auto", "on", "off"] = "auto"
    """'auto': LPIPS only if torchvision's AlexNet weights are in the torch hub cache (no download);
    'on': always (may download); 'off': never."""
    semantic_eval_metrics: bool = True
    """Report mean teacher cosine (and its VCD-weighted version) in eval metrics."""


class Rh3dgsModel(SplatfactoModel):
    """Splatfacto with per-Gaussian semantic latents (see module docstring)."""

    config: Rh3dgsModelConfig

    # ------------------------------------------------------------------ setup
    def populate_modules(self):
        # Re-done (not super()) because splatfacto's version calls .cuda() and builds LPIPS
        # (which downloads AlexNet); the rest of SplatfactoModel is reused as is.
        cfg = self.config
        if cfg.rasterize_mode != "classic":
            raise ConfigError("rh3dgs: only rasterize_mode='classic' is supported by the rh3dgs rasterization path")
        if cfg.latent_dim < 1:
            raise ConfigError(f"rh3dgs: latent_dim must be >= 1, got {cfg.latent_dim}")
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
        params = {"means": means, "scales": scales, "quats": quats, "features_dc": features_dc,
                  "features_rest": features_rest, "opacities": opacities}
        if cfg.semantics:
            params["latents"] = Parameter(torch.randn(n, cfg.latent_dim, generator=gen) * cfg.latent_init_std)
        self.gauss_params = torch.nn.ParameterDict(params)
        # decoder [D, d]; D is only known from the teacher: a placeholder until
        # initialize_semantics() (or load_state_dict) sets the real one.
        teacher_dim = int((self.kwargs.get("metadata") or {}).get("rh3dgs_teacher_dim", cfg.latent_dim))
        self.decoder = Parameter(torch.linalg.qr(torch.randn(teacher_dim, cfg.latent_dim, generator=gen))[0]
                                 if teacher_dim >= cfg.latent_dim else torch.randn(teacher_dim, cfg.latent_dim, generator=gen))
        self.semantics_initialized = False

        self.camera_optimizer = cfg.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")

        from nerfstudio.model_components.lib_bilagrid import BilateralGrid
        from pytorch_msssim import SSIM
        from torchmetrics.image import PeakSignalNoiseRatio

        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self._lpips_module: Optional[torch.nn.Module] = None  # built lazily, not a submodule
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
        self.lic_loss = LICLoss(cfg.lic)
        self.info: Dict = {}
        self._sem_cache = None
        # text-query elements for nerfstudio's viewer (no parameters; see rh3dgs/nerfstudio/viewer.py)
        from .viewer import TextQueryPanel

        self.text_query = TextQueryPanel(self)

    # LPIPS: lazily, only with local weights in "auto" mode; kept out of the state dict.
    @property
    def lpips(self):  # type: ignore[override]
        if self._lpips_module is None:
            mode = self.config.lpips
            module: torch.nn.Module = _NoLPIPS()
            if mode == "on" or (mode == "auto" and _alexnet_weights_available()):
                try:
                    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

                    module = LearnedPerceptualImagePatchSimilarity(normalize=True).to(self.device)
                except Exception as e:  # no network / no weights
                    CONSOLE.print(f"[yellow]rh3dgs: LPIPS unavailable ({type(e).__name__}: {e}); not reported")
                    module = _NoLPIPS()
            object.__setattr__(self, "_lpips_module", module)
        return self._lpips_module

    @property
    def latents(self) -> Tensor:
        return self.gauss_params["latents"]

    @property
    def teacher_dim(self) -> int:
        return int(self.decoder.shape[0])

    def load_state_dict(self, dict, **kwargs):  # type: ignore
        """Resize the Gaussian parameters and the decoder to the checkpoint's, then load.

        Unlike splatfacto's version, the Parameter *objects* are kept (only ``.data`` is
        resized), so optimizers built before loading (``ns-train --load-dir`` resumes) still
        hold the model's parameters.
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
        if "decoder" in dict and tuple(dict["decoder"].shape) != tuple(self.decoder.shape):
            self.decoder.data = torch.zeros(dict["decoder"].shape, device=self.decoder.device)
        self.semantics_initialized = True
        return torch.nn.Module.load_state_dict(self, dict, **kwargs)

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

    def get_gaussian_param_groups(self) -> Dict[str, List[Parameter]]:
        groups = super().get_gaussian_param_groups()
        if self.config.semantics:
            groups["latents"] = [self.gauss_params["latents"]]
        return groups

    def get_param_groups(self) -> Dict[str, List[Parameter]]:
        groups = super().get_param_groups()
        if self.config.semantics:
            groups["decoder"] = [self.decoder]
        return groups

    # ------------------------------------------------------------------ rendering
    def gaussians_for_render(self, crop_ids: Optional[Tensor] = None, detach: bool = False) -> Gaussians:
        """The current Gaussians as :class:`rh3dgs.Gaussians` (SH degree in use, optional crop)."""
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

    def _empty(self, W: int, H: int, background: Tensor) -> Dict[str, Tensor]:
        out = self.get_empty_outputs(W, H, background)
        if self.config.semantics:
            out["latents"] = background.new_zeros(H, W, self.config.latent_dim)
        return out

    def get_outputs(self, camera: NSCameras) -> Dict[str, Union[Tensor, List]]:
        from ..rendering import render

        if not isinstance(camera, NSCameras):
            return {}
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
                return self._empty(int(camera.width.item()), int(camera.height.item()), self.background_color)

        scale = self._get_downscale_factor()
        camera.rescale_output_resolution(1 / scale)
        K = camera.get_intrinsics_matrices().to(self.device).reshape(-1, 3, 3)
        W, H = int(camera.width.reshape(-1)[0].item()), int(camera.height.reshape(-1)[0].item())
        self.last_size = (H, W)
        camera.rescale_output_resolution(scale)

        cams = Cameras(viewmats=viewmat_from_c2w(c2w.to(self.device).float()), Ks=K.float(), width=W, height=H)
        g = self.gaussians_for_render(crop_ids)
        sem = self.config.semantics
        res = render(g, cams, g.latents if sem else None, rgb=True)  # ONE call: RGB + latents + A, D1, D2
        means2d = res.projection.means2d
        self.info = {"means2d": means2d, "radii": res.radii, "width": W, "height": H, "n_cameras": 1,
                     "gaussian_ids": None, "depths": res.projection.depths}
        if self.training and means2d.requires_grad:
            self.strategy.step_pre_backward(self.gauss_params, self.optimizers, self.strategy_state, self.step,
                                            self.info)

        alpha = res.alpha[..., None]  # [1, H, W, 1]
        background = self._get_background_color()
        rgb = torch.clamp(res.rgb + (1 - alpha) * background, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training:
            if camera.metadata is not None and "cam_idx" in camera.metadata:
                rgb = self._apply_bilateral_grid(rgb, camera.metadata["cam_idx"], H, W)
        depth = res.depth[..., None]
        depth = torch.where(alpha > 0, depth, depth.detach().max()).squeeze(0)
        if background.shape[0] == 3 and not self.training:
            background = background.expand(H, W, 3)
        out = {
            "rgb": rgb.squeeze(0),
            "depth": depth,
            "accumulation": alpha.squeeze(0),
            "background": background,
            "depth_m1": res.d1.squeeze(0)[..., None],
            "depth_m2": res.d2.squeeze(0)[..., None],
        }
        if sem:
            out["latents"] = res.features.squeeze(0)  # [H, W, d]
        if sem and not self.training:
            out["semantics"] = self.semantic_colors(out["latents"])
            # viewer: relevancy_<i> and composited while a text query is set (empty otherwise)
            out.update(self.text_query.outputs(out, g, cams, crop_ids))
        return out

    # ------------------------------------------------------------------ semantics
    def decode(self, latents: Tensor) -> Tensor:
        """[..., d] -> [..., D] unit teacher-space features."""
        return F.normalize(latents @ self.decoder.T, dim=-1)

    @torch.no_grad()
    def semantic_colors(self, latents: Tensor) -> Tensor:
        """[H, W, d] -> [H, W, 3] false colours (decoded features on the decoder's top-3 axes)."""
        U = torch.linalg.svd(self.decoder.detach().float(), full_matrices=False)[0][:, :3]  # [D, <=3]
        z = self.decode(latents.float()) @ U
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

    def _semantic_inputs(self, outputs, batch):
        """Pool render + stats to the loss resolution, resize the teacher, VCD weights (memoised per
        outputs dict: metrics and losses of one step share it) -> (lat, teacher, valid, w_bar, A, D1, D2)."""
        key = (outputs["latents"], batch["teacher"])  # references: identity cannot be recycled
        if self._sem_cache is not None and self._sem_cache[0][0] is key[0] and self._sem_cache[0][1] is key[1]:
            return self._sem_cache[1]
        lat = outputs["latents"][None]
        A, D1, D2 = outputs["accumulation"][None], outputs["depth_m1"][None], outputs["depth_m2"][None]
        H, W = lat.shape[1:3]
        s = max(1.0, math.sqrt(H * W / max(1, self.config.semantic_max_pixels)))
        size = (max(1, int(H / s)), max(1, int(W / s)))
        lat, A, D1, D2 = (_area_resize(t, size) for t in (lat, A, D1, D2))
        A, D1, D2 = A[..., 0], D1[..., 0], D2[..., 0]
        with torch.no_grad():
            teacher = prepare_map(batch["teacher"].to(lat.device), size)[None]
            valid = teacher.norm(dim=-1) > 0.5
            if self.config.semantic_min_coverage > 0:
                valid = valid & (A >= self.config.semantic_min_coverage)
            if "mask" in batch:
                m = batch["mask"].to(lat.device).float()
                valid = valid & (_bilinear_resize(m, size)[..., 0] > 0.5)[None]
            if self.config.use_vcd:
                w = reliability_weights(A, D1, D2, features=teacher, cfg=self.config.vcd, valid_mask=valid)
            else:
                w = valid.float()
        res = (lat, teacher, valid, w, A, D1, D2)
        self._sem_cache = (key, res)
        return res

    def _semantic_weight(self) -> float:
        cfg = self.config
        if self.step < cfg.semantic_start_step:
            return 0.0
        if cfg.semantic_warmup_steps <= 0:
            return cfg.lambda_sem
        return cfg.lambda_sem * min(1.0, (self.step - cfg.semantic_start_step + 1) / cfg.semantic_warmup_steps)

    def get_loss_dict(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        if not self.training:
            return self._semantic_loss_dict(outputs, batch, metrics_dict)
        self._check_params()
        try:
            loss_dict = self._semantic_loss_dict(outputs, batch, metrics_dict)
            bad = [k for k, v in loss_dict.items() if not torch.isfinite(v).all()]
        except NonFiniteError as exc:  # NaN / Inf met inside a loss (e.g. the robust Frechet mean)
            loss_dict, bad = {"main_loss": torch.zeros((), device=self.device)}, [f"semantic loss ({exc})"]
        return self._guard_losses(loss_dict, bad)

    def _check_params(self) -> None:
        """Every ``check_params_every`` steps: stop if a Gaussian parameter or the decoder holds NaN / Inf."""
        cfg = self.config
        if cfg.check_params_every <= 0 or self.step % cfg.check_params_every != 0:
            return
        params = dict(self.gauss_params.items())
        if cfg.semantics:
            params["decoder"] = self.decoder
        for name, p in params.items():
            if not torch.isfinite(p).all():
                raise NonFiniteError(
                    f"ns-train rh3dgs: parameter '{name}' has {int((~torch.isfinite(p)).sum())} NaN/Inf values at "
                    f"step {self.step}; training stopped. The last saved checkpoint is the last good one: resume "
                    "from it with --load-dir, and lower the learning rates or lambda_sem / lambda_con.")

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

    def _semantic_loss_dict(self, outputs, batch, metrics_dict=None) -> Dict[str, Tensor]:
        loss_dict = super().get_loss_dict(outputs, batch, metrics_dict)
        if "teacher" not in batch or "latents" not in outputs:
            return loss_dict
        cfg = self.config
        lam = self._semantic_weight()
        if lam > 0:
            lat, teacher, valid, w = self._semantic_inputs(outputs, batch)[:4]
            self._sem_cache = None  # release the step's graph
            pred = lat @ self.decoder.T
            l_vfm, parts = vfm_loss(pred, teacher, w, max(0, self.step - cfg.semantic_start_step), cfg.vfm)
            loss_dict["vfm_loss"] = lam * l_vfm
        if cfg.semantics and cfg.lambda_con > 0 and self.training and self.step >= cfg.lic.warmup_steps:
            loss_dict["lic_loss"] = cfg.lambda_con * self.lic_loss(self.latents, self.step, means=self.means.detach())
        return loss_dict

    @torch.no_grad()
    def _semantic_metrics(self, outputs, batch) -> Dict[str, Tensor]:
        """``sem_cos``: mean cosine of decoded rendered features to the teacher on valid pixels the
        scene covers (A >= 0.5); ``sem_cos_vcd``: the same weighted by the VCD weights w_bar."""
        # The step's loss re-uses these memoised inputs: build them with autograd on, or the
        # loss would see graph-less latents and train the decoder only (the metrics run first).
        with torch.enable_grad():
            lat, teacher, valid, w, A = self._semantic_inputs(outputs, batch)[:5]
        cos = (self.decode(lat.detach()) * teacher).sum(-1)
        v = (valid & (A.detach() >= 0.5)).float()  # pixels the scene covers
        out = {"sem_cos": (cos * v).sum() / v.sum().clamp_min(1.0)}
        out["sem_cos_vcd"] = (cos * w).sum() / w.sum().clamp_min(1e-12)
        if not self.training:
            self._sem_cache = None
        return out

    def get_metrics_dict(self, outputs, batch) -> Dict[str, Tensor]:
        metrics = super().get_metrics_dict(outputs, batch)
        if "teacher" in batch and "latents" in outputs:
            metrics.update(self._semantic_metrics(outputs, batch))
        return metrics

    def get_image_metrics_and_images(self, outputs, batch):
        metrics, images = super().get_image_metrics_and_images(outputs, batch)
        if "lpips" in metrics and not math.isfinite(metrics["lpips"]):
            del metrics["lpips"]
        if "cc_lpips" in metrics and not math.isfinite(metrics["cc_lpips"]):
            del metrics["cc_lpips"]
        if self.config.semantic_eval_metrics and "teacher" in batch and "latents" in outputs:
            sem = self._semantic_metrics(outputs, batch)
            metrics.update({k: float(v) for k, v in sem.items()})
            H, W = outputs["latents"].shape[:2]
            t = prepare_map(batch["teacher"].to(self.device), (H, W))
            U = torch.linalg.svd(self.decoder.detach().float(), full_matrices=False)[0][:, :3]
            tv = t @ U
            if tv.shape[-1] < 3:
                tv = F.pad(tv, (0, 3 - tv.shape[-1]))
            images["semantics"] = torch.cat([(tv * 0.5 + 0.5).clamp(0, 1), self.semantic_colors(outputs["latents"])],
                                            dim=1)
        return metrics, images
