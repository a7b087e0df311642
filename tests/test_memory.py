"""The memory model and the preflight: estimates in step with the lift, jobs refused before they allocate."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rh3dgs.errors import ConfigError, MemoryLimitError
from rh3dgs.lifting import LiftConfig
from rh3dgs.lifting.preflight import lift_memory_estimate, preflight_lift
from rh3dgs.memory import format_bytes, memory_budget, memory_limit, parse_size

from _scenes import random_lift_scene

ROOT = Path(__file__).resolve().parents[1]


def test_parse_size_and_budget(monkeypatch):
    assert parse_size("8G") == 8 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1.5k") == 1536
    assert parse_size(" 2e9 ") == 2_000_000_000 and parse_size(4096) == 4096 and parse_size(None) is None
    for bad in ("lots", "-1G", "0", "8X", True):
        with pytest.raises(ConfigError, match="--max-memory"):
            parse_size(bad)
    avail, src = memory_budget()
    assert avail > 0 and "available on this machine" in src
    with memory_limit("1M"):
        assert memory_budget() == (1 << 20, "the limit set by --max-memory (1.00 MiB)")
    monkeypatch.setenv("RH3DGS_MAX_MEMORY", "2M")
    assert memory_budget()[0] == 2 << 20
    with memory_limit("1M"):  # the explicit limit wins over the environment
        assert memory_budget()[0] == 1 << 20
    assert format_bytes(3 * 2**30) == "3.00 GiB" and format_bytes(231 * 2**40) == "231 TiB"


@pytest.mark.parametrize("cfg_kw", [{}, {"method": "euclidean"}, {"cache_projections": False},
                                    {"cache_projections": False, "compact_cache": False},
                                    {"record_contributions": False}, {"views_per_batch": 3},
                                    {"max_batch_gaussians": 500}])
def test_lift_estimate_follows_lifting_rules(cfg_kw):
    """The estimate predicts the cache and batch size the lift actually uses (rh3dgs.lifting.views.cache_plan)."""
    from rh3dgs.lifting import LiftConfig, lift
    g, cams, maps = random_lift_scene(n=400, views=5, size=32, D=8)
    cfg = LiftConfig(iters=1, latent_dim=0, **cfg_kw)
    est = lift_memory_estimate(len(g), len(cams), 32, 32, 8, cfg=cfg)
    info = lift(g, cams, maps, cfg, progress=False).info
    assert est.cache == info["cache"] and est.views_per_batch == info["views_per_batch"]
    assert (est.recorded_bytes > 0) == (info["recorded_chunks"] > 0)
    assert est.peak_bytes >= est.streaming_bytes > 0


def test_lift_estimate_counts_the_principal_subspace():
    """A teacher with D > LiftConfig.subspace is lifted in its subspace: the passes' maps take subspace
    channels, and the features mapped back N x D floats."""
    from rh3dgs.lifting import LiftConfig

    n, v, h, w = 100_000, 20, 64, 64
    sub = lift_memory_estimate(n, v, h, w, 512, cfg=LiftConfig(subspace=128))
    full = lift_memory_estimate(n, v, h, w, 512, cfg=LiftConfig(subspace=0))
    d128 = lift_memory_estimate(n, v, h, w, 128, cfg=LiftConfig(subspace=0))
    assert sub.detail["batch_teacher_maps"] == d128.detail["batch_teacher_maps"] < full.detail["batch_teacher_maps"]
    assert sub.detail["gaussian_state"] == d128.detail["gaussian_state"] + n * 512 * 4
    assert sub.peak_bytes < full.peak_bytes


def test_lift_estimate_of_one_rank():
    """Over K processes the estimate is one rank's: its views' caches, the Gaussians its views see (bounded by N)
    and the block of N / K it owns. Two ranks of one thread each against one process of two threads."""
    one = lift_memory_estimate(1_000_000, 300, 64, 64, 64, threads=2)
    two = lift_memory_estimate(1_000_000, 300, 64, 64, 64, threads=1, world_size=2)
    assert two.cache == one.cache == "compact" and "owned_block" not in one.detail
    assert two.detail["owned_block"] == 500_000 * (4 * 64 + 5) * 4
    assert two.detail["gaussian_state"] == one.detail["gaussian_state"] + 1_000_000 * 59 * 4
    assert 2 * two.detail["thread_accumulators"] == one.detail["thread_accumulators"]
    full_cache = lambda e: e.cached_bytes - e.streaming_bytes  # noqa: E731  (150 views' instead of 300's)
    assert full_cache(two) < 0.51 * full_cache(one)
    assert lift_memory_estimate(1000, 8, 32, 32, 8, world_size=4).detail["batch_views"] == 2  # 8 views / 4 ranks


def test_preflight_names_the_knob_that_fits():
    n, views, h, w, d = 100_000, 200, 256, 256, 64
    est = lift_memory_estimate(n, views, h, w, d)
    assert est.cache == "compact" and est.views_per_batch == 8
    with memory_limit(est.peak_bytes + 1):
        assert preflight_lift(n, views, h, w, d).peak_bytes == est.peak_bytes
    # just below the cached peak: streaming fits
    with memory_limit(est.peak_bytes - 1), pytest.raises(MemoryLimitError) as ei:
        preflight_lift(n, views, h, w, d)
    msg = str(ei.value)
    assert "memory estimate" in msg and "to fit: --streaming" in msg and "--views-per-batch 7" in msg
    # below the streaming peak: fewer views per batch, then a downscale
    one = lift_memory_estimate(n, views, h, w, d, views_per_batch=1, cfg=LiftConfig(compact_cache=False))
    with memory_limit(one.peak_bytes + 1), pytest.raises(MemoryLimitError) as ei:
        preflight_lift(n, views, h, w, d)
    assert "--views-per-batch 1 --streaming" in str(ei.value) and "--downscale 2" in str(ei.value)
    state = one.detail["gaussian_state"] + one.detail["thread_accumulators"] + one.detail["batch_projections"]
    with memory_limit(state + 2_000_000), \
            pytest.raises(MemoryLimitError, match=r"--downscale \d+ \(images of"):
        preflight_lift(n, views, h, w, d)
    with memory_limit("1M"), pytest.raises(MemoryLimitError, match="fewer Gaussians"):
        preflight_lift(n, views, h, w, d)


# ------------------------------------------------------------------ the four cases, end to end
_DRIVER = r"""
import atexit, resource, sys, time
t0 = time.perf_counter()
ru = lambda: resource.getrusage(resource.RUSAGE_SELF)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent's memory (pytest's own peak when
# subprocess vforks), VmHWM belongs to this process's address space alone
hwm = lambda: int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")).split()[1])
atexit.register(lambda: print(f"PEAK_RSS_MB {hwm() / 1024:.0f} SECONDS {time.perf_counter() - t0:.2f} "
                              f"CPU {ru().ru_utime + ru().ru_stime:.2f}", file=sys.stderr))
from rh3dgs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run(argv, timeout=120):
    """The CLI in its own process; returns (exit code, stderr, its peak RSS in MB, its wall and CPU seconds)."""
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _DRIVER, *map(str, argv)], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=ROOT)
    tail = [ln for ln in r.stderr.splitlines() if ln.startswith("PEAK_RSS_MB")][-1].split()
    errors = [ln for ln in r.stderr.splitlines() if not ln.startswith("PEAK_RSS_MB")]
    return r.returncode, "\n".join(errors), float(tail[1]), (float(tail[3]), float(tail[5]))


def _dataset(root: Path, frames: int, w: int, h: int, fmap=(4, 4, 16)) -> Path:
    """transforms.json of ``frames`` frames (all showing one small image), precomputed features, a small PLY."""
    from rh3dgs.data.synthetic import SceneConfig, make_scene
    from rh3dgs.io.ply import save_ply

    (root / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "images" / "a.png")
    (root / "features").mkdir()
    np.save(root / "features" / "a.npy", np.ones(fmap, np.float16))
    frame = {"file_path": "images/a.png", "transform_matrix": np.eye(4).tolist()}
    meta = {"fl_x": 0.8 * w, "w": w, "h": h, "frames": [frame] * frames}
    (root / "transforms.json").write_text(json.dumps(meta))
    save_ply(root / "scene.ply", make_scene(SceneConfig(num_views=1, image_size=16)).gaussians)
    return root


def _assert_refused(rc, err, rss, secs, *fragments):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rh3dgs: error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]
    assert rss < 1024, f"peak RSS {rss} MB"
    print(f"refused in {secs[0]:.2f} s ({secs[1]:.2f} s CPU), peak RSS {rss:.0f} MB: {lines[0][:160]}...")


def test_120k_frames_stop_with_the_estimate(tmp_path):
    """A 120k-frame transforms.json: the caches across passes grow with the frame count (to their 2 GB cap);
    over a 1 GB budget the lift stops and names --streaming, which fits; 12 frames fit the same budget."""
    data = _dataset(tmp_path / "d", 120_000, 64, 64)
    out = tmp_path / "out"
    rc, err, rss, secs = _run(["--max-memory", "1G", "lift", data / "scene.ply", "--data", data, "--output", out])
    _assert_refused(rc, err, rss, secs, "lift of", "over 120000 views", "memory estimate", "--streaming")
    assert not out.exists()
    with memory_limit("1G"):
        preflight_lift(2000, 12, 64, 64, 16)


def test_40000_square_images_stop_with_the_estimate(tmp_path):
    data = _dataset(tmp_path / "d", 3, 40000, 40000)
    rc, err, rss, secs = _run(["lift", data / "scene.ply", "--data", data, "--output", tmp_path / "out"])
    _assert_refused(rc, err, rss, secs, "views of 40000x40000", "memory estimate", "--downscale")
    rc, err, rss, secs = _run(["render", data / "scene.ply", "--transforms", data, "--output", tmp_path / "r"])
    _assert_refused(rc, err, rss, secs, "at 40000x40000", "memory estimate", "--downscale")
    assert not (tmp_path / "out").exists() and not (tmp_path / "r").exists()


def test_ply_header_of_10e12_vertices_stops_with_the_estimate(tmp_path):
    data = _dataset(tmp_path / "d", 3, 64, 64)
    from rh3dgs.io.ply import ply_field_names

    hdr = "ply\nformat binary_little_endian 1.0\nelement vertex 1000000000000\n"
    hdr += "".join(f"property float {nm}\n" for nm in ply_field_names(3)) + "end_header\n"
    huge = tmp_path / "huge.ply"
    huge.write_bytes(hdr.encode() + bytes(4096))
    rc, err, rss, secs = _run(["render", huge, "--transforms", data, "--output", tmp_path / "r"])
    _assert_refused(rc, err, rss, secs, str(huge), "1000000000000 'vertex' rows", "memory estimate")


def test_teacher_map_of_1e5_squared_stops_with_the_estimate(tmp_path):
    data = _dataset(tmp_path / "d", 3, 64, 64)
    npy = data / "features" / "a.npy"
    with open(npy, "wb") as f:  # the header of a 100000 x 100000 x 16 float16 map, and hardly any data
        np.lib.format.write_array_header_1_0(f, {"descr": "<f2", "fortran_order": False,
                                                 "shape": (100000, 100000, 16)})
        f.write(bytes(1024))
    rc, err, rss, secs = _run(["lift", data / "scene.ply", "--data", data, "--output", tmp_path / "out"])
    _assert_refused(rc, err, rss, secs, str(npy), "100000x100000x16 float16 feature map", "memory estimate")


@pytest.mark.slow
def test_small_files_claiming_big_sizes_stop_before_they_allocate(tmp_path):
    """Issue 41's reads, each in its own process: a 512 MB teacher map in a ~0.5 MB .npz under --max-memory 512M,
    a text_embeddings.npz and a scene's field.npz with a 1 GB member, a PNG whose header claims 40000x40000
    (extract), synth --views 10000000: one line, peak RSS under 1 GB, within 60 s."""
    import shutil

    from _hostile import inflating_npz, png_claiming

    data = _dataset(tmp_path / "d", 3, 64, 64)
    (data / "features" / "a.npy").unlink()
    inflating_npz(data / "features" / "a.npz", "features", (2048, 2048, 64), np.float16)  # 512 MB inflated
    text = _dataset(tmp_path / "t", 3, 64, 64)
    inflating_npz(text / "features" / "text_embeddings.npz", "red mug", (1 << 28,), np.float32)  # 1 GB
    from fuzz.targets import seed_dir

    scene = tmp_path / "scene"
    shutil.copytree(seed_dir() / "scene", scene)
    meta = json.loads((scene / "rh3dgs.json").read_text())
    meta.pop("files")  # so that field.npz's own reader, not the checksum, meets the new file
    (scene / "rh3dgs.json").write_text(json.dumps(meta))
    inflating_npz(scene / "field.npz", "decoder", (1 << 14, 1 << 14), np.float32)  # 1 GB
    png = _dataset(tmp_path / "p", 1, 8, 8)
    png_claiming(png / "images" / "a.png", 40000, 40000)
    cases = [
        (["--max-memory", "512M", "lift", data / "scene.ply", "--data", data, "--output", tmp_path / "o1", "--frame",
          "data"], ["a.npz", "2048x2048x64 float16", "memory estimate"]),
        (["--max-memory", "512M", "lift", text / "scene.ply", "--data", text, "--output", tmp_path / "o2", "--frame",
          "data"], ["text_embeddings.npz", "memory estimate"]),
        (["--max-memory", "512M", "export", scene, "--output", tmp_path / "o3.ply"], ["field.npz", "memory estimate"]),
        (["extract", "--data", png, "--teacher", "tiny-clip"], ["a.png", "decompression bomb"]),
        (["synth", "--output", tmp_path / "o5", "--views", "10000000"], ["10000000"]),
    ]
    for argv, fragments in cases:
        rc, err, rss, secs = _run(argv)
        _assert_refused(rc, err, rss, secs, *fragments)
        assert secs[0] < 60
