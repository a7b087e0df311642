"""benchmarks/bench_nstrain.py: its measurement function for a handful of iterations of both methods,
and the ``splatfacto-native-lite`` model it uses as the CPU splatfacto baseline."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("nerfstudio")
pytest.importorskip("gsplat")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_nstrain  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return bench_nstrain.make_data(tmp_path_factory.mktemp("nstrain") / "data", views=10, size=32)


def test_measure_training_both_methods(data, tmp_path):
    base = bench_nstrain.measure_training("splatfacto", data, iters=4, warmup=1, device="cpu", out=tmp_path / "a")
    ours = bench_nstrain.measure_training("rh3dgs", data, iters=4, warmup=1, device="cpu", out=tmp_path / "b")
    for r in (base, ours):
        assert r["iters"] == 4 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["mean_ms"] > 0
        assert r["cpu_mean_ms"] > 0 and r["peak_rss_mb"] > 0 and r["gaussians_start"] > 100
    assert base["gaussians_start"] == ours["gaussians_start"]  # the same seed points
    assert base["label"] == "splatfacto (CPU port: rh3dgs model, semantics off)"
    # the baseline optimises exactly splatfacto's parameter groups; rh3dgs adds latents, decoder and the background latent
    assert not {"latents", "decoder", "background_latent"} & set(base["param_groups"])
    assert set(ours["param_groups"]) == set(base["param_groups"]) | {"latents", "decoder", "background_latent"}
    with pytest.raises(ValueError):
        bench_nstrain.measure_training("nope", data, iters=2, warmup=1)


def test_semantics_off_model_is_plain_splatfacto(data, tmp_path):
    from nerfstudio.engine.optimizers import Optimizers

    c = bench_nstrain.method_config("splatfacto", data, tmp_path, "cpu", iters=5)
    with bench_nstrain._setup_shims(cuda=False):
        pipe = c.pipeline.setup(device="cpu", test_mode="val")
    m = pipe.model
    assert "latents" not in m.gauss_params and not pipe.datamanager.with_teacher
    assert not (tmp_path / "teacher_cache").exists()  # the teacher never ran
    opt = Optimizers(c.optimizers, pipe.get_param_groups())
    m.optimizers = opt.optimizers
    m.train()
    cam, batch = pipe.datamanager.next_train(0)
    assert "teacher" not in batch
    out = m(cam)
    assert "latents" not in out and out["rgb"].shape[-1] == 3
    assert set(m.get_loss_dict(out, batch, m.get_metrics_dict(out, batch))) == {"main_loss", "scale_reg"}
    m.eval()
    cam, batch = pipe.datamanager.fixed_indices_eval_dataloader[0]
    out = m.get_outputs_for_camera(cam)
    assert "semantics" not in out
    metrics, _ = m.get_image_metrics_and_images(out, batch)
    assert "psnr" in metrics and "sem_cos" not in metrics


@pytest.mark.parametrize("fox", [False, True])
def test_measure_pair_interleaves_both_methods(data, fox):
    """Every row's measurement: both methods set up in one interpreter (``fox``: the fox row's teacher tiny-clip and
    latents at random), their iterations interleaved; the same seed points and per-method timings."""
    import nerfstudio.configs.base_config  # noqa: F401  (before writer: the two import each other)
    from nerfstudio.utils import writer

    before = list(writer.EVENT_WRITERS)
    pair = bench_nstrain.measure_pair(data, iters=3, warmup=1, fox=fox)
    # its trainers' writers (into a folder it deleted) do not outlive it: a later trainer would flush into them
    assert writer.EVENT_WRITERS == before
    assert set(pair) == {"splatfacto", "rh3dgs"}
    for r in pair.values():
        assert r["iters"] == 3 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["setup_s"] > 0
    assert pair["splatfacto"]["gaussians_start"] == pair["rh3dgs"]["gaussians_start"] > 100
    # what measure_training reports of a run, per method: the baseline's groups are splatfacto's alone
    assert set(pair["rh3dgs"]["param_groups"]) == set(pair["splatfacto"]["param_groups"]) | {
        "latents", "decoder", "background_latent"}
    assert pair["rh3dgs"]["seed_ply_read_by"] == pair["splatfacto"]["seed_ply_read_by"]


def test_fox_seeded_keeps_the_colmap_points_and_adds_jittered_copies(tmp_path):
    import json

    import numpy as np
    from plyfile import PlyData, PlyElement

    ns = tmp_path / "ns"
    (ns / "images").mkdir(parents=True)
    (ns / "transforms.json").write_text(json.dumps({"w": 4, "h": 4, "frames": []}))
    rng = np.random.default_rng(0)
    pts = np.zeros(50, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    xyz = rng.random((50, 3)).astype(np.float32)
    for i, k in enumerate("xyz"):
        pts[k] = xyz[:, i]
    pts["red"] = np.arange(50)
    PlyData([PlyElement.describe(pts, "vertex")]).write(str(ns / "sparse_pc.ply"))
    out = bench_nstrain.fox_seeded(ns, tmp_path / "fox", n=500)
    v = PlyData.read(str(out / "sparse_pc.ply"))["vertex"]
    got = np.stack([v["x"], v["y"], v["z"]], -1)
    assert v.count == 500 and np.array_equal(got[:50], xyz) and np.array_equal(v["red"][:50], np.arange(50))
    # each copy lies near the point whose colour it carries (jitter: half its 3-NN distance per axis)
    from scipy.spatial import cKDTree

    idx = np.asarray(v["red"][50:]).astype(int)
    sigma = cKDTree(xyz).query(xyz, k=4)[0][:, 1:].mean(1)[idx, None] / 2
    z = (got[50:] - xyz[idx]) / sigma
    assert np.abs(z).max() < 6 and 0.8 < z.std() < 1.2
    assert (out / "images").resolve() == (ns / "images").resolve()
    assert json.loads((out / "transforms.json").read_text())["w"] == 4
