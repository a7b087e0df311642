"""Data-parallel feature extraction: ``torchrun --nproc_per_node=2 -m rh3dgs.cli extract`` on CPU (gloo).

The real torchrun launches two ranks on a small generated dataset with the tiny random CLIP
teacher; the cache they fill must hold every image's features, equal to a single-process
extraction, computed in disjoint shards, and a second launch must compute nothing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rh3dgs.cli import main
from rh3dgs.io.transforms import load_transforms
from rh3dgs.teachers import extract_features, load_cached, teacher_cache_dir, teacher_from_spec
from rh3dgs.teachers.cache import MANIFEST_NAME, _entry_valid

VIEWS = 10
SUMMARY = re.compile(r"(\d+) feature maps \((\d+) computed, (\d+) reused\) over (\d+) processes \(([\d + ]+) computed\)")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dist") / "data"
    assert main(["synth", "--output", str(d), "--views", str(VIEWS), "--size", "32", "--seed", "2"]) == 0
    return d


def _torchrun(data: Path, cache: Path, nproc: int = 2) -> tuple:
    exe = Path(sys.executable).parent / "torchrun"
    launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = launcher + ["--standalone", f"--nproc_per_node={nproc}", "-m", "rh3dgs.cli", "extract", "--data",
                      str(data), "--teacher", "tiny-clip", "--cache", str(cache)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    found = SUMMARY.findall(r.stdout)
    assert len(found) == 1, r.stdout  # rank 0 alone prints the summary
    total, computed, reused, world, by_rank = found[0]
    return int(total), int(computed), int(reused), int(world), [int(x) for x in by_rank.split("+")]


def test_torchrun_two_ranks_fill_the_cache_like_one_process(data, tmp_path):
    _, images = load_transforms(data, check_images=True)
    teacher = teacher_from_spec({"name": "tiny-clip"})
    ref_stats: dict = {}
    ref = extract_features(teacher, images, tmp_path / "ref", progress=False, stats=ref_stats)
    assert ref_stats["computed"] == len(images) == VIEWS

    # a killed earlier distributed run left two entries and rank 1's journal vouching for them:
    # reused, and the new rank 1 carries the journal over instead of overwriting it
    cache = tmp_path / "cache"
    folder = teacher_cache_dir(teacher, cache)
    folder.mkdir(parents=True)
    ref_manifest = json.loads((ref[0].parent / MANIFEST_NAME).read_text())
    planted = {p.name[:-4]: ref_manifest["entries"][p.name[:-4]] for p in ref[:2]}
    for p in ref[:2]:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "manifest.rank1.json").write_text(json.dumps(dict(ref_manifest, entries=planted)))

    total, computed, reused, world, by_rank = _torchrun(data, cache)
    assert (total, computed, reused, world) == (VIEWS, VIEWS - 2, 2, 2)
    # each rank computed a share, and the shares add up to the missing entries: with every entry
    # present (below), no entry was computed twice
    assert len(by_rank) == 2 and all(n > 0 for n in by_rank) and sum(by_rank) == VIEWS - 2
    manifest = json.loads((folder / MANIFEST_NAME).read_text())["entries"]
    assert not list(folder.glob("manifest.rank*.json"))  # rank 0 folded the per-rank journals in
    for p in ref:
        assert p.name[:-4] in manifest and _entry_valid(folder, manifest[p.name[:-4]], p.name[:-4])
        got = np.load(folder / p.name)
        assert got.dtype == np.float16 and np.allclose(got, np.load(p), atol=1e-3), p.name
        assert load_cached(folder / p.name).shape == load_cached(p).shape

    # a second launch: everything is a cache hit
    total, computed, reused, world, by_rank = _torchrun(data, cache)
    assert (total, computed, reused, by_rank) == (VIEWS, 0, VIEWS, [0, 0])
    # and the single-process path reads what the ranks wrote
    stats: dict = {}
    extract_features(teacher, images, cache, progress=False, stats=stats)
    assert stats["computed"] == 0 and stats["reused"] == VIEWS


def test_rank_journals_of_a_killed_run_are_reused_then_absorbed(data, tmp_path):
    """A distributed run killed before rank 0 wrote the manifest leaves per-rank journals: their
    entries are reused, and the next manifest write folds them in."""
    _, images = load_transforms(data, check_images=True)
    images = images[:4]
    teacher = teacher_from_spec({"name": "tiny-clip"})
    cache = tmp_path / "cache"
    paths = extract_features(teacher, images, cache, progress=False)
    folder = teacher_cache_dir(teacher, cache)
    records = json.loads((folder / MANIFEST_NAME).read_text())
    entries = sorted(records["entries"])
    (folder / MANIFEST_NAME).unlink()
    for r, part in enumerate((entries[:2], entries[2:])):
        (folder / f"manifest.rank{r}.json").write_text(
            json.dumps(dict(records, entries={e: records["entries"][e] for e in part})))

    stats: dict = {}
    assert extract_features(teacher, images, cache, progress=False, stats=stats) == paths
    assert stats["computed"] == 0 and stats["reused"] == 4
    paths[0].unlink()  # one entry lost: recomputed, and that manifest write absorbs the journals
    extract_features(teacher, images, cache, progress=False, stats=stats)
    assert stats["computed"] == 1 and stats["reused"] == 3
    assert not list(folder.glob("manifest.rank*.json"))
    assert sorted(json.loads((folder / MANIFEST_NAME).read_text())["entries"]) == entries
