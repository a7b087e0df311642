"""A/B of rasterizer builds (not part of `make bench`): one thread, the trees' runs interleaved round by round.

    python benchmarks/ab_builds.py TREE [TREE ...]      # ROUNDS=5 by default

TREE is a checkout whose extension is built in place (``python setup.py build_ext --inplace``, or a worktree
after ``make install``). Per tree and round, a fresh interpreter (PYTHONPATH=TREE, OMP_NUM_THREADS=1) times
bench_rasterize's forward (20k Gaussians, 256x256, 16 channels, no autograd), its forward + backward, and
``rh3dgs.render`` at 512x512 of 50k Gaussians, RGB and RGB + 16 latents: the minimum CPU time over its 5
repeats. Prints per tree the minimum over the rounds and a hash of the forward's render and alpha (equal hashes:
bit-identical outputs). The pairs composited are the same for every tree, so a forward time ratio is the
ratio of pairs per second per core.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r'''
import hashlib, json, sys, time
import torch
sys.path.insert(0, sys.argv[2])
from _common import random_scene, orbit
from rh3dgs.ops import rasterize_to_pixels
from rh3dgs.rendering import project, render
torch.manual_seed(0)
g = random_scene(20000); cams = orbit(1, 256)
with torch.no_grad(): p = project(g, cams)
feats = torch.randn(1, 20000, 16, generator=torch.Generator().manual_seed(1))
g2 = random_scene(50000, scale=0.03); cam2 = orbit(1, 512)
lat = torch.randn(50000, 16, generator=torch.Generator().manual_seed(1))
def fwd():
    with torch.no_grad():
        return rasterize_to_pixels(p.means2d, p.conics, feats, p.opacities, p.depths, 256, 256, p.tile_size, p.isect_offsets, p.flatten_ids)
def fb():
    ins = [t.detach().clone().requires_grad_(True) for t in (p.means2d, p.conics, feats, p.opacities, p.depths)]
    o = rasterize_to_pixels(*ins, 256, 256, p.tile_size, p.isect_offsets, p.flatten_ids)
    (o.render.sum() + o.alpha.sum() + o.d1.sum() + o.d2.sum()).backward()
def rgb():
    with torch.no_grad(): render(g2, cam2)
def sem():
    with torch.no_grad(): render(g2, cam2, lat)
out = {}
for name, fn in (("fwd", fwd), ("fwd_bwd", fb), ("rgb512", rgb), ("rgb16_512", sem)):
    fn()
    ts = []
    for _ in range(int(sys.argv[1])):
        c = time.process_time(); fn(); ts.append(time.process_time() - c)
    out[name] = min(ts) * 1000
o = fwd()
out["render_hash"] = hashlib.sha256(o.render.numpy().tobytes() + o.alpha.numpy().tobytes()).hexdigest()[:12]
print(json.dumps(out))
'''
trees, rounds = [str(Path(t).resolve()) for t in sys.argv[1:]], int(os.environ.get("ROUNDS", "5"))
res = {t: [] for t in trees}
for r in range(rounds):
    for t in trees:
        env = dict(os.environ, PYTHONPATH=t, OMP_NUM_THREADS="1")
        p = subprocess.run([sys.executable, "-c", CHILD, "5", str(HERE)], env=env, capture_output=True, text=True,
                           cwd=HERE.parent)
        if p.returncode:
            sys.exit(f"{t}: {p.stderr[-2000:]}")
        res[t].append(json.loads(p.stdout.strip().splitlines()[-1]))
for t in trees:
    keys = ["fwd", "fwd_bwd", "rgb512", "rgb16_512"]
    best = {k: min(x[k] for x in res[t]) for k in keys}
    print(t, " ".join(f"{k} {best[k]:.2f} ms" for k in keys), f"rgb16/rgb {best['rgb16_512'] / best['rgb512']:.3f}",
          "hash", res[t][0]["render_hash"])
