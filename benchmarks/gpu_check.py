"""GPU check, Python part (run by benchmarks/gpu_check.sh on a lent GPU; ``--device cpu`` dry-runs it here).

1. Op agreement: each native op on ``--device`` against the CPU kernel (values and gradients of
   ``rasterize_to_pixels``; ``aggregate_sphere`` in both modes; ``isect_tiles``; ``relevancy``; ``lic_infonce`` values and gradients).
2. Render frame rate at 1280x720 of a 200k-Gaussian scene: RGB, and RGB + 16 latent channels
   (+ the relevancy of one query), in the same run.

Prints a Markdown report and writes it (with a JSON copy) to ``--out``.

    python benchmarks/gpu_check.py --device cuda --out benchmarks/results/gpu_check
    python benchmarks/gpu_check.py --device cpu --quick      # dry run of the same code on CPU
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, orbit, random_scene  # noqa: E402


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max()) if a.numel() else 0.0


def agreement(dev: torch.device, n: int, size: int) -> dict:
    """Max abs differences between the ops on ``dev`` and the CPU kernels, on one random scene."""
    from rh3dgs.ops import aggregate_sphere, isect_tiles, lic_infonce, rasterize_to_pixels, relevancy
    from rh3dgs.query import TEMPERATURE
    from rh3dgs.rendering import project

    g = random_scene(n, scale=0.03)
    cams = orbit(2, size)
    with torch.no_grad():
        p = project(g, cams)
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, n, 16, generator=gen)
    out = {}

    def raster(device):
        ins = [t.detach().to(device).clone().requires_grad_(True)
               for t in (p.means2d, p.conics, feats, p.opacities, p.depths)]
        o = rasterize_to_pixels(*ins, size, size, p.tile_size, p.isect_offsets.to(device), p.flatten_ids.to(device))
        w = torch.linspace(0.5, 1.5, 16, device=device)
        ((o.render * w).sum() + o.alpha.sum() + 0.1 * o.d1.sum() + 0.01 * o.d2.sum()).backward()
        return [o.render, o.alpha, o.d1, o.d2] + [t.grad for t in ins]

    names = ["render", "alpha", "d1", "d2", "v_means2d", "v_conics", "v_features", "v_opacities", "v_depths"]
    for name, a, b in zip(names, raster(dev), raster(torch.device("cpu"))):
        out[f"rasterize.{name}"] = _max_err(a, b)

    D = 32
    maps = torch.nn.functional.normalize(torch.randn(2, size, size, D, generator=gen), dim=-1)
    w = torch.rand(2, size, size, generator=gen)
    mu = torch.nn.functional.normalize(torch.randn(n, D, generator=gen), dim=-1)
    for mode in ("init", "irls"):
        res = [aggregate_sphere(p.means2d.to(d), p.conics.to(d), p.opacities.to(d), maps.to(d), w.to(d),
                                p.isect_offsets.to(d), p.flatten_ids.to(d), p.tile_size, mu=mu.to(d), delta=0.35,
                                mode=mode) for d in (dev, torch.device("cpu"))]
        for i, name in enumerate(("acc_w", "acc_v", "acc_raw")):
            scale = float(res[1][i].abs().max().clamp_min(1.0))
            out[f"aggregate.{mode}.{name} (relative)"] = _max_err(res[0][i], res[1][i]) / scale

    bins = [isect_tiles(p.means2d.to(d), p.radii.to(d), p.depths.to(d), p.tile_size, size // p.tile_size + 1,
                        size // p.tile_size + 1) for d in (dev, torch.device("cpu"))]
    out["isect_tiles.flatten_ids (mismatches)"] = float((bins[0][2].cpu() != bins[1][2]).sum()) \
        if bins[0][2].shape == bins[1][2].shape else float("inf")

    lat = torch.randn(size * size, 16, generator=gen)
    q, neg, R = torch.randn(2, 16, generator=gen), torch.randn(4, 16, generator=gen), torch.eye(16)
    tau = TEMPERATURE
    out["relevancy"] = _max_err(relevancy(lat.to(dev), q.to(dev), neg.to(dev), R.to(dev), tau),
                                relevancy(lat, q, neg, R, tau))

    # LIC InfoNCE on the scene's latents: 256 anchors, 16 neighbour-like + 64 random candidates
    anchors = torch.randint(n, (256,), generator=gen)
    cand = torch.randint(n, (256, 80), generator=gen)
    kinds = torch.randint(0, 3, (256, 80), generator=gen, dtype=torch.uint8)
    lic = []
    for d in (dev, torch.device("cpu")):
        x = feats[0].to(d).clone().requires_grad_(True)
        loss = lic_infonce(x, anchors.to(d), cand.to(d), kinds.to(d), 0.1)
        loss.sum().backward()
        lic.append((loss, x.grad))
    out["lic_infonce.loss"] = _max_err(lic[0][0], lic[1][0])
    out["lic_infonce.grad"] = _max_err(lic[0][1], lic[1][1])
    return out


def frame_rates(dev: torch.device, n: int, width: int, height: int, repeats: int) -> dict:
    """Frames per second of RGB and RGB + 16 latents (+ relevancy of one query) at width x height."""
    from rh3dgs import Cameras
    from rh3dgs.field import SemanticField
    from rh3dgs.rendering import render

    g = random_scene(n, scale=0.02).to(dev)
    gen = torch.Generator().manual_seed(1)
    field = SemanticField(torch.randn(n, 16, generator=gen), torch.randn(64, 16, generator=gen)).to(dev)
    cam = Cameras.look_at(torch.tensor([[3.5, 0.0, 1.0]]), torch.zeros(3), width=width, height=height).to(dev)
    phi = torch.nn.functional.normalize(torch.randn(1, 64, generator=gen), dim=-1).to(dev)
    neg = torch.nn.functional.normalize(torch.randn(4, 64, generator=gen), dim=-1).to(dev)

    def rgb():
        render(g, cam)

    def semantic():
        r = render(g, cam, field.latents)
        field.relevancy(r.features[0], phi, neg)

    out = {}
    with torch.no_grad():
        for name, fn in (("RGB", rgb), ("RGB + semantic (16 latents + relevancy)", semantic)):
            fn()
            _sync(dev)
            t = time.perf_counter()
            for _ in range(repeats):
                fn()
            _sync(dev)
            out[name] = repeats / (time.perf_counter() - t)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes (a dry run of the code path)")
    ap.add_argument("--out", default=None, help="folder for gpu_check.md / .json")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device")
    n, size = (3000, 64) if a.quick else (50_000, 256)
    fps_n, (fw, fh), reps = (20_000, (320, 180), 2) if a.quick else (200_000, (1280, 720), 20)
    from rh3dgs.ops._backend import has_native_kernel

    t0 = time.time()
    agree = agreement(dev, n, size)
    fps = frame_rates(dev, fps_n, fw, fh, reps)
    payload = {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "native_cuda_kernels": dev.type == "cuda" and has_native_kernel("rasterize_fwd", dev),
               "agreement_max_abs": agree, "fps": fps, "fps_setting": {"gaussians": fps_n, "size": [fw, fh]},
               "seconds": time.time() - t0, "machine": machine()}
    md = [f"# gpu_check ({payload['device_name']}, native CUDA kernels: {payload['native_cuda_kernels']})\n",
          f"## {dev} ops vs the CPU kernels ({n} Gaussians, 2 views at {size}x{size})\n",
          "| quantity | max abs difference |", "|---|---|"]
    md += [f"| {k} | {v:.3g} |" for k, v in agree.items()]
    md += ["", f"## Frame rate at {fw}x{fh}, {fps_n} Gaussians\n", "| output | FPS |", "|---|---|"]
    md += [f"| {k} | {v:.1f} |" for k, v in fps.items()]
    ratio = fps["RGB + semantic (16 latents + relevancy)"] / fps["RGB"]
    md += ["", f"semantic / RGB frame rate: {ratio:.2f}; {payload['seconds']:.0f} s"]
    text = "\n".join(md) + "\n"
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.md").write_text(text)
        (out / "gpu_check.json").write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
