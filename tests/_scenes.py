"""Small random scenes shared by the tests (deterministic given a seed)."""
from __future__ import annotations

import math

import torch

from rh3dgs.ops import isect_tiles


def on_device(obj, device):
    """``obj`` (a tensor, or a dict / list / tuple / dataclass of them and other values) with every tensor moved to
    ``device``."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: on_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: on_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_device(v, device) for v in obj)
    return obj


def random_projected(B: int, N: int, C: int, width: int, height: int, tile_size: int = 16, seed: int = 0,
                     dtype=torch.float32):
    """Random 2D Gaussians already 'projected': returns a dict of rasterizer inputs."""
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(B, N, 2, generator=g) * torch.tensor([width * 1.2, height * 1.2]) - torch.tensor(
        [width * 0.1, height * 0.1])
    # random SPD 2x2 covariances with std 1..6 px
    s = 1.0 + 5.0 * torch.rand(B, N, 2, generator=g)
    th = torch.rand(B, N, generator=g) * math.pi
    c, si = torch.cos(th), torch.sin(th)
    R = torch.stack([torch.stack([c, -si], -1), torch.stack([si, c], -1)], -2)
    cov = R @ torch.diag_embed(s ** 2) @ R.transpose(-1, -2)
    inv = torch.linalg.inv(cov)
    conics = torch.stack([inv[..., 0, 0], inv[..., 0, 1], inv[..., 1, 1]], -1)
    radii = torch.ceil(3 * s.max(-1).values).int()
    opacities = 0.05 + 0.9 * torch.rand(B, N, generator=g)
    depths = 1.0 + 4.0 * torch.rand(B, N, generator=g)
    features = torch.randn(B, N, C, generator=g)
    tw, th_ = math.ceil(width / tile_size), math.ceil(height / tile_size)
    _, offsets, flatten_ids = isect_tiles(means2d, radii, depths, tile_size, tw, th_)
    out = dict(means2d=means2d, conics=conics, features=features, opacities=opacities, depths=depths,
               width=width, height=height, tile_size=tile_size, isect_offsets=offsets, flatten_ids=flatten_ids)
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in out.items()}


def random_lift_scene(n: int = 300, views: int = 4, size: int = 40, D: int = 8, seed: int = 0, scale: float = 0.06,
                      opacity: tuple = (0.3, 0.6), map_offset: float = 1.5):
    """Random 3D Gaussians, cameras on a circle and random unit teacher maps at 1/4 resolution.

    Scales ``scale * exp(0.3 N(0,1))``, opacities uniform in ``[opacity[0], opacity[0] + opacity[1]]``,
    maps ``normalize(N(0,1) + map_offset)``."""
    from rh3dgs import Cameras, Gaussians

    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) - 0.5) * 1.6
    gs = Gaussians.from_activated(means, scale * torch.exp(0.3 * torch.randn(n, 3, generator=g)),
                                  torch.randn(n, 4, generator=g), opacity[0] + opacity[1] * torch.rand(n, generator=g),
                                  torch.rand(n, 3, generator=g))
    eyes = torch.tensor([[3 * math.cos(a), 3 * math.sin(a), 0.8] for a in torch.linspace(0, 2 * math.pi, views + 1)[:-1]])
    cams = Cameras.look_at(eyes, torch.zeros(3), width=size, height=size)
    maps = torch.nn.functional.normalize(torch.randn(views, size // 4, size // 4, D, generator=g) + map_offset, dim=-1)
    return gs, cams, maps


def synthetic_dataset(root, views: int, size: int, density: float, teacher: bool = True, **scene):
    """The synthetic scene (``SceneConfig(num_views=views, image_size=size, gaussians_per_unit_area=density,
    **scene)``) written as a dataset at ``root``, with the simulated teacher's maps when ``teacher``; returns root."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
    from rh3dgs.data.teacher_sim import simulate_teacher

    write_dataset(make_scene(SceneConfig(num_views=views, image_size=size, gaussians_per_unit_area=density, **scene)),
                  root, progress=False)
    if teacher:
        simulate_teacher(root, progress=False)
    return root


def rendered_labels(scene, cameras=None):
    """A synthetic scene's class map and depth per view, rendered from its Gaussians: ``(labels [B, H, W] with 255
    where the accumulated opacity is below 0.5, depth [B, H, W] with 0 there)``, what the teacher simulators read."""
    from rh3dgs.rendering import render

    cameras = scene.cameras if cameras is None else cameras
    onehot = torch.nn.functional.one_hot(scene.class_ids, len(scene.class_names)).float()
    with torch.no_grad():
        r = render(scene.gaussians, cameras, onehot, rgb=False)
    lab = r.features.argmax(-1)
    lab[r.alpha < 0.5] = 255
    return lab, torch.where(r.alpha > 0.5, r.depth, torch.zeros_like(r.depth))
