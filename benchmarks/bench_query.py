"""Relevancy fast path (query folded into latent space) vs the slow path (decode to D, normalise).

1M pixel-equivalents of rendered latents (d = 16) against 4 queries + 4 canonical negatives in
a D = 512 teacher space. Both paths give the same relevancy (checked here to 1e-5).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, timeit, write_results  # noqa: E402

P, d, D, Q, J = 1_000_000, 16, 512, 4, 4


def main() -> dict:
    from rh3dgs.field import SemanticField
    from rh3dgs.query import relevancy, relevancy_from_cosines

    g = torch.Generator().manual_seed(0)
    dec = torch.linalg.qr(torch.randn(D, d, generator=g))[0]
    field = SemanticField(torch.zeros(1, d), dec)
    lat = torch.randn(P, d, generator=g)
    phi = torch.nn.functional.normalize(torch.randn(Q, D, generator=g), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(J, D, generator=g), dim=-1)
    out = {}

    def fast():
        cos = field.cosine(lat, torch.cat([phi, neg]))
        out["fast"] = relevancy_from_cosines(cos[:, :Q], cos[:, Q:])

    def slow():
        out["slow"] = relevancy(field.decode(lat), phi, neg)

    tf = timeit(fast, repeats=3)["median_s"]
    ts = timeit(slow, repeats=2)["median_s"]
    err = float((out["fast"] - out["slow"]).abs().max())
    assert err < 1e-5, err
    payload = {"pixels": P, "latent_dim": d, "teacher_dim": D, "queries": Q, "fast_s": tf, "slow_s": ts,
               "speedup": ts / tf, "max_abs_diff": err, "machine": machine()}
    md = (f"# relevancy: latent fast path vs decoded slow path\n\n{P} pixels, d={d}, D={D}, {Q} queries + {J} "
          f"negatives.\n\n| path | seconds |\n|---|---|\n| slow (decode to D) | {ts:.3f} |\n| fast (latent) | {tf:.3f} |\n\n"
          f"**speed-up {ts / tf:.1f}x**, max |difference| {err:.1e}\n")
    return write_results("query", payload, md)


if __name__ == "__main__":
    main()
