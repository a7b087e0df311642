"""The training-free lift: teacher maps -> one robust, reliability-weighted feature per Gaussian.

    config.py     LiftConfig, every setting of the lift (``rh3dgs lift``'s options)
    algorithm.py  lift(): the passes (weighted mean, Huber IRLS steps), validity, fill, PCA decoder
    views.py      the view stream one pass runs over: teacher maps, renders, VCD weights, caches across passes
    preflight.py  the lift's memory model and the check that refuses a lift before it allocates
    fill.py       features for the Gaussians no view showed, from their observed 3D neighbours
    shard.py      a process's share past one process: its views, the Gaussians they see, the block it owns
    checkpoint.py the state after each pass, so that a rerun resumes (and the distillation's checkpoint folder)

>>> from rh3dgs.data.synthetic import SceneConfig, make_scene
>>> from rh3dgs.lifting import LiftConfig, lift
>>> import torch
>>> scene = make_scene(SceneConfig(num_views=2, image_size=16, gaussians_per_unit_area=200.0))
>>> maps = torch.nn.functional.normalize(torch.randn(2, 16, 16, 8), dim=-1)
>>> res = lift(scene.gaussians, scene.cameras, maps, LiftConfig(latent_dim=4))
>>> res.features.shape[1], res.latents.shape[1]
(8, 4)
"""
from .algorithm import LiftResult, initial_field, lift, pca_decoder
from .config import LiftConfig

__all__ = ["LiftConfig", "LiftResult", "initial_field", "lift", "pca_decoder"]
