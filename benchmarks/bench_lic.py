"""LIC cost per step vs one training step, at 50k Gaussians.

Training step (the baseline, measured in the same run): render RGB + 16-d latents for one
256x256 view, forward + backward through an L1 RGB loss and the VFM pixel loss.
LIC step: the objective's LIC (``LICConfig.rh3dgs()``: appearance positives, the pull form over sampled
anchors, forward + backward), plus the amortised cost of its refresh (radius graph + colour positives every
``refresh_every`` steps). The random scene's colours are quantised to 8 flat colours (2 levels a channel), as
surfaces of uniformly coloured objects; with continuous random colours almost no neighbour is a positive.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import entry, machine, orbit, peak_rss_mb, random_scene, run_isolated, timeit, write_results  # noqa: E402

N, SIZE, D_LAT = 50_000, 256, 16
PAIRS = 9


def measure(part: str) -> dict:
    """Everything, in this interpreter (run by :func:`main` in a fresh one: its peak RSS is its own)."""
    from rh3dgs.method.lic import LICConfig, LICLoss
    from rh3dgs.rendering import render
    from rh3dgs.method.vfm import pixel_loss

    g = random_scene(N, scale=0.03)
    cam = orbit(1, SIZE)
    latents = torch.nn.functional.normalize(torch.randn(N, D_LAT), dim=-1).requires_grad_(True)
    target_rgb = torch.rand(1, SIZE, SIZE, 3)
    teacher = torch.nn.functional.normalize(torch.randn(1, SIZE, SIZE, D_LAT), dim=-1)
    means = g.means.clone().requires_grad_(True)

    def train_step():
        g.means = means
        r = render(g, cam, latents)
        loss = (r.rgb - target_rgb).abs().mean()
        loss = loss + pixel_loss(torch.nn.functional.normalize(r.features, dim=-1), teacher, r.alpha.detach(), 0.5)
        loss.backward()

    base_rss = peak_rss_mb()
    train_step()  # warm-up
    cfg = LICConfig.rh3dgs()
    lic = LICLoss(cfg)
    colors = (g.base_colors > 0.5).float()  # 8 flat colours
    refresh = timeit(lambda: lic.refresh(g.means.detach(), latents.detach(), step=0, colors=colors), repeats=1,
                     warmup=0)["median_s"]

    def lic_step():
        loss = lic(latents, step=10)
        loss.backward()

    lic_step()  # warm-up
    # PAIRS alternating (training step, LIC step) runs: the machine's speed drifts by 10-20 % between runs
    bases, steps, ratios = [], [], []
    for _ in range(PAIRS):
        bases.append(timeit(train_step, repeats=1, warmup=0)["median_s"])
        steps.append(timeit(lic_step, repeats=1, warmup=0)["median_s"])
        ratios.append((steps[-1] + refresh / cfg.refresh_every) / bases[-1])
    base, step = statistics.median(bases), statistics.median(steps)
    amortised = step + refresh / cfg.refresh_every
    payload = {"setting": {"gaussians": N, "size": SIZE, "latent_dim": D_LAT, "anchors": cfg.num_anchors},
               "train_step_s": base, "lic_step_s": step, "lic_refresh_s": refresh,
               "lic_amortised_s": amortised, "ratio_lic_to_train_step": statistics.median(ratios), "pairs": PAIRS,
               "num_anchors": cfg.num_anchors, "max_neighbors": cfg.max_neighbors,
               "num_random_negatives": cfg.num_random_negatives, "refresh_every": cfg.refresh_every,
               "form": cfg.form, "positives": cfg.positives, "eligible_fraction": lic.eligible.numel() / N,
               "peak_rss_mb": peak_rss_mb(), "rss_over_setup_mb": peak_rss_mb() - base_rss, "machine": machine()}
    return payload


def main() -> dict:
    p = run_isolated(__file__, ["--only", "all"])
    base, step, refresh, amortised = p["train_step_s"], p["lic_step_s"], p["lic_refresh_s"], p["lic_amortised_s"]
    ratio = p["ratio_lic_to_train_step"]
    md = (f"# LIC cost vs a training step\n\n{N} Gaussians, {D_LAT}-d latents, the objective's LIC "
          f"(`LICConfig.rh3dgs()`: {p['positives']} positives, {p['form']} form), {p['num_anchors']} anchors, up to "
          f"{p['max_neighbors']} neighbours per anchor ({100 * p['eligible_fraction']:.0f} % of the Gaussians have a "
          f"positive: 8 flat colours), refresh every {p['refresh_every']} steps; training step = RGB + latents "
          f"render at {SIZE}x{SIZE}, forward + backward.\n\n"
          f"| | seconds |\n|---|---|\n| training step (baseline) | {base:.4f} |\n| LIC step | {step:.4f} |\n"
          f"| LIC refresh (graph + positives) | {refresh:.3f} |\n| LIC amortised | {amortised:.4f} |\n\n"
          f"**LIC / training step: {100 * ratio:.1f} %** (target < 10 %; median over {p['pairs']} alternating "
          "(training step, LIC step) pairs of the per-pair ratio, refresh amortised; the table gives medians)\n\n"
          f"peak RSS {p['peak_rss_mb']:.0f} MB (this benchmark's own interpreter; "
          f"{p['rss_over_setup_mb']:.0f} MB over the scene setup)\n")
    return write_results("lic", p, md)


if __name__ == "__main__":
    entry(measure, main)
