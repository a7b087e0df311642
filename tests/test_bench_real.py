"""benchmarks/bench_real.py: the skip without data, the loader's handling of +inf opacities, the orbit
cameras, and its per-pixel composited count against the torch reference's contributions."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import plyfile
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_real  # noqa: E402


def test_skipped_with_a_reason_without_the_data(monkeypatch, tmp_path):
    monkeypatch.setenv("RH3DGS_REALDATA", str(tmp_path / "missing"))
    out = bench_real.main()
    assert "skipped" in out and "realdata" in out["skipped"]


def test_loader_accepts_inf_opacities(tmp_path):
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
             "rot_0", "rot_1", "rot_2", "rot_3"]
    v = np.zeros(3, dtype=[(n, "f4") for n in names])
    v["rot_0"] = 1.0
    v["opacity"] = [np.inf, 0.0, -np.inf]  # what splat-transform writes for opaque splats
    path = tmp_path / "s.ply"
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")]).write(str(path))
    g, n_clamped = bench_real.load_splat(path, tmp_path)
    assert n_clamped in (0, 2)  # 0 once load_ply accepts +/-inf itself
    op = g.activated_opacities
    assert op[0] > 0.999 and abs(op[1] - 0.5) < 1e-6 and op[2] < 1e-3


def _scene(n=400, seed=0):
    from rh3dgs import Gaussians

    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=gen) * 0.3 + torch.tensor([0.5, -1.0, 0.2])
    return Gaussians.from_activated(means, 0.05 * torch.rand(n, 3, generator=gen) + 0.01, torch.randn(n, 4, generator=gen),
                                    0.2 + 0.7 * torch.rand(n, generator=gen), torch.rand(n, 3, generator=gen))


def test_orbit_cameras_look_at_the_median_centre():
    g = _scene()
    cams = bench_real.orbit_cameras(g, (0.0, -1.0, 0.0), 96, 64, views=4)
    centre = g.means.median(0).values
    p = (cams.viewmats[:, :3, :3] @ centre + cams.viewmats[:, :3, 3])  # camera space
    uv = (cams.Ks @ p[..., None])[..., 0]
    torch.testing.assert_close(uv[:, :2] / uv[:, 2:], torch.tensor([[48.0, 32.0]]).expand(4, 2), atol=1e-3, rtol=0)
    dist = (cams.centers - centre).norm(dim=1)
    torch.testing.assert_close(dist, dist[:1].expand(4))  # one orbit radius


def test_composited_per_pixel_counts_the_reference_contributions():
    from rh3dgs.ops._ref import _ref_tile_contributions
    from rh3dgs.rendering import project

    g = _scene(seed=1)
    cams = bench_real.orbit_cameras(g, (0.0, -1.0, 0.0), 48, 32, views=1)
    with torch.no_grad():
        p = project(g, cams)
    got = bench_real.composited_per_pixel(p, 48, 32)
    counts = torch.zeros(48 * 32)
    for _, pix, _, w, _ in _ref_tile_contributions(p.means2d, p.conics, p.opacities, 48, 32, 16, p.isect_offsets,
                                                   p.flatten_ids):
        counts[pix] += (w > 0).sum(1).float()
    assert counts.sum() > 48 * 32  # several layers per pixel
    assert abs(got["mean"] - float(counts.mean())) < 1e-6
    assert got["max"] == float(counts.max())
