"""nerfstudio method registrations: ``rh3dgs`` (full schedule), ``rh3dgs-lite`` (CPU-sized) and their plain
splatfacto twins ``splatfacto-native`` / ``splatfacto-native-lite`` (the same schedules, no semantics: the RGB
baseline, on rh3dgs's rasterizer).

Registered through the ``nerfstudio.method_configs`` entry point (see setup.py)::

    ns-train rh3dgs --data DIR
    ns-train rh3dgs-lite --machine.device-type cpu --data DIR --vis tensorboard
    ns-train splatfacto-native-lite --machine.device-type cpu --data DIR --vis tensorboard

Without the entry point installed, ``NERFSTUDIO_METHOD_CONFIGS`` works too
(:data:`rh3dgs.nerfstudio.METHOD_CONFIGS_ENV`)::

    NERFSTUDIO_METHOD_CONFIGS="rh3dgs=rh3dgs.nerfstudio.config:rh3dgs_method,rh3dgs-lite=rh3dgs.nerfstudio.config:rh3dgs_lite_method" ns-train rh3dgs-lite ...

Importing this module installs :mod:`rh3dgs.nerfstudio.run_guard` (nerfstudio's reads of config.yml
build no arbitrary objects; our errors end in one line).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Type

import torch
from torch.optim import lr_scheduler

from nerfstudio.configs.base_config import LoggingConfig, ViewerConfig
from nerfstudio.engine.optimizers import AdamOptimizerConfig
from nerfstudio.engine.schedulers import ExponentialDecayScheduler
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig as _NSExponentialDecaySchedulerConfig
from nerfstudio.engine.trainer import TrainerConfig
from nerfstudio.plugins.types import MethodSpecification

from .datamanager import Rh3dgsDataManagerConfig
from .dataparser import Rh3dgsDataParserConfig
from .model import Rh3dgsModelConfig
from .pipeline import Rh3dgsPipelineConfig
from .splatfacto_native import SplatfactoNativeModelConfig
from .trainer import Rh3dgsTrainerConfig
from . import run_guard

# nerfstudio imports this module (method discovery) before any ns-* script reads a run's config.yml:
# from here on that read cannot build arbitrary objects, and our errors print as one line (run_guard)
run_guard.install()


class FloatExponentialDecayScheduler(ExponentialDecayScheduler):
    """nerfstudio's exponential decay with python-float learning rates.

    nerfstudio's lambda returns numpy scalars, which end up in the optimizer / scheduler state
    of every checkpoint and make ``torch.load(weights_only=True)`` (torch >= 2.6's default,
    used by ``ns-train --load-dir``, ``ns-eval``, ``ns-viewer``) refuse it.
    """

    def get_scheduler(self, optimizer, lr_init):
        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr_init)
        f = super().get_scheduler(probe, lr_init).lr_lambdas[0]
        return lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: float(f(step)))


@dataclass
class ExponentialDecaySchedulerConfig(_NSExponentialDecaySchedulerConfig):
    """:class:`FloatExponentialDecayScheduler` (checkpoints loadable with ``weights_only=True``)."""

    _target: Type = field(default_factory=lambda: FloatExponentialDecayScheduler)


__all__ = ["ExponentialDecaySchedulerConfig", "make_optimizers", "rh3dgs_config", "rh3dgs_lite_config", "rh3dgs_method",
           "rh3dgs_lite_method", "splatfacto_native_config", "splatfacto_native_lite_config",
           "splatfacto_native_method", "splatfacto_native_lite_method", "LITE_MODEL"]

SEMANTIC_GROUPS = ("latents", "decoder", "background_latent")
"""The optimizer groups of the semantic model only."""


def make_optimizers(max_steps: int, semantic: bool = True) -> dict:
    """splatfacto's optimizer groups + (``semantic``) the semantic ones at ``DistillConfig``'s rates: ``latents``
    2e-3, ``decoder`` 0 (kept as the lift's basis; ``--optimizers.decoder.optimizer.lr`` trains it),
    ``background_latent`` 0.01, with eps 1e-15 so their steps do not depend on the semantic loss's weight."""
    groups = {
        "means": {"optimizer": AdamOptimizerConfig(lr=1.6e-4, eps=1e-15),
                  "scheduler": ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=max_steps)},
        "features_dc": {"optimizer": AdamOptimizerConfig(lr=0.0025, eps=1e-15), "scheduler": None},
        "features_rest": {"optimizer": AdamOptimizerConfig(lr=0.0025 / 20, eps=1e-15), "scheduler": None},
        "opacities": {"optimizer": AdamOptimizerConfig(lr=0.05, eps=1e-15), "scheduler": None},
        "scales": {"optimizer": AdamOptimizerConfig(lr=0.005, eps=1e-15), "scheduler": None},
        "quats": {"optimizer": AdamOptimizerConfig(lr=0.001, eps=1e-15), "scheduler": None},
        "latents": {"optimizer": AdamOptimizerConfig(lr=2e-3, eps=1e-15), "scheduler": None},
        "decoder": {"optimizer": AdamOptimizerConfig(lr=0.0), "scheduler": None},
        "background_latent": {"optimizer": AdamOptimizerConfig(lr=0.01, eps=1e-15), "scheduler": None},
        "camera_opt": {"optimizer": AdamOptimizerConfig(lr=1e-4, eps=1e-15),
                       "scheduler": ExponentialDecaySchedulerConfig(lr_final=5e-7, max_steps=max_steps,
                                                                    warmup_steps=1000, lr_pre_warmup=0)},
        "bilateral_grid": {"optimizer": AdamOptimizerConfig(lr=2e-3, eps=1e-15),
                           "scheduler": ExponentialDecaySchedulerConfig(lr_final=1e-4, max_steps=max_steps,
                                                                        warmup_steps=1000, lr_pre_warmup=0)},
    }
    return groups if semantic else {k: v for k, v in groups.items() if k not in SEMANTIC_GROUPS}


LITE_MODEL = dict(
    max_init_points=4000,
    num_random=4000,  # no seed points: 4k random Gaussians, not splatfacto's 50k
    background_color="black",  # the synthetic scenes' background; "random" for real captures
    densify_grad_thresh=0.0004,
    num_downscales=0,
    sh_degree=1,
    sh_degree_interval=100,
    warmup_length=60,
    refine_every=30,
    stop_split_at=200,
    reset_alpha_every=100,  # x refine_every = 3000 > steps: no opacity reset
    stop_screen_size_at=0,  # no screen-size split/prune: 5% of a 64 px image is 3 px
)
"""The lite presets' splatfacto settings (``rh3dgs-lite``, ``splatfacto-native-lite``)."""


def _trainer(method_name: str, model, lite: bool) -> TrainerConfig:
    """A method's TrainerConfig: splatfacto's 30k schedule, or the lite one (300 steps), around ``model``."""
    steps = 300 if lite else 30000
    return Rh3dgsTrainerConfig(
        method_name=method_name,
        steps_per_eval_image=150 if lite else 100,
        steps_per_eval_batch=0,
        steps_per_save=300 if lite else 2000,
        steps_per_eval_all_images=100000 if lite else 1000,
        max_num_iterations=steps,
        mixed_precision=False,
        **(dict(logging=LoggingConfig(steps_per_log=50)) if lite else {}),
        pipeline=Rh3dgsPipelineConfig(
            datamanager=Rh3dgsDataManagerConfig(
                dataparser=Rh3dgsDataParserConfig(),  # seed points via plyfile (no open3d)
                cache_images_type="uint8",
            ),
            model=model,
        ),
        optimizers=make_optimizers(steps, semantic=isinstance(model, Rh3dgsModelConfig)),
        viewer=ViewerConfig(num_rays_per_chunk=1 << 15, websocket_host="127.0.0.1"),  # this machine only
        vis="viewer",
    )


def rh3dgs_config() -> TrainerConfig:
    """Full schedule (30k steps, splatfacto's densification; the semantic objective of ``distill()``, weighted 0.1
    against the RGB loss (``Rh3dgsModelConfig.objective``), from the lift, its schedules spanning the run)."""
    return _trainer("rh3dgs", Rh3dgsModelConfig(), lite=False)


def rh3dgs_lite_config() -> TrainerConfig:
    """CPU-sized preset: 300 steps, no image pyramid, <= 4k seed points (4k random ones without), black background,
    densification between steps 60 and 200 (threshold 4e-4), latent_dim 8; the objective of ``distill()``, weighted
    0.1 against the RGB loss (``Rh3dgsModelConfig.objective``)."""
    return _trainer("rh3dgs-lite", Rh3dgsModelConfig(**LITE_MODEL, latent_dim=8), lite=True)


def splatfacto_native_config() -> TrainerConfig:
    """:func:`rh3dgs_config` without semantics: splatfacto on rh3dgs's rasterizer (runs on a CPU too)."""
    return _trainer("splatfacto-native", SplatfactoNativeModelConfig(), lite=False)


def splatfacto_native_lite_config() -> TrainerConfig:
    """:func:`rh3dgs_lite_config` without semantics: the RGB baseline of ``rh3dgs-lite`` (``bench_nstrain``)."""
    return _trainer("splatfacto-native-lite", SplatfactoNativeModelConfig(**LITE_MODEL), lite=True)


rh3dgs_method = MethodSpecification(
    config=rh3dgs_config(),
    description="Rh-3DGS: splatfacto + semantic latents distilled with VCD-weighted Riemannian Huber (VFM) from the robust lift.",
)

rh3dgs_lite_method = MethodSpecification(
    config=rh3dgs_lite_config(),
    description="Rh-3DGS, small CPU-friendly preset (300 steps; e.g. --machine.device-type cpu).",
)

splatfacto_native_method = MethodSpecification(
    config=splatfacto_native_config(),
    description="splatfacto on rh3dgs's rasterizer (CPU or CUDA), no semantics: the RGB baseline of rh3dgs.",
)

splatfacto_native_lite_method = MethodSpecification(
    config=splatfacto_native_lite_config(),
    description="splatfacto-native on rh3dgs-lite's schedule (300 steps): rh3dgs-lite's RGB baseline.",
)
