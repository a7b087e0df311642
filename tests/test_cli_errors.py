"""Every bad input the ``rh3dgs`` CLI can be given, as a table: argv -> a fragment the one-line error must hold.

Each case runs ``rh3dgs.cli.main(argv)`` in this process and requires exit code 2 and exactly one line on
stderr, ``rh3dgs: error: ...``, naming the file or the argument (no traceback, nothing else). The inputs
are tiny files made by the fuzzers' seeds (``tests/fuzz/targets.py``), each broken in one way.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _hostile import inflating_npz as _inflating_npz, png_claiming as _png_claiming
from fuzz.targets import seed_dir
from rh3dgs.cli import main

LONG = "x" * 300  # a file name longer than any file system allows (NAME_MAX 255)


def _dataset(root: Path, name: str, edit=None, image: bool = True) -> Path:
    """A copy of the seed dataset (one 4x3 image) with ``edit(transforms dict)`` applied."""
    seeds = seed_dir()
    d = root / name
    d.mkdir()
    if image:
        shutil.copy(seeds / "data" / "img0.png", d / "img0.png")
    tj = json.loads((seeds / "data" / "transforms.json").read_text())
    if edit:
        edit(tj)
    (d / "transforms.json").write_text(json.dumps(tj))
    return d


def _with_features(d: Path, fmap: np.ndarray) -> Path:
    (d / "features").mkdir()
    np.save(d / "features" / "img0.npy", fmap)
    shutil.copy(seed_dir() / "text_embeddings.npz", d / "features" / "text_embeddings.npz")
    return d


def _set(**kw):
    return lambda tj: tj.update(kw)


def _frames(n):
    return lambda tj: tj.update(frames=[tj["frames"][0]] * n)  # n views of the one image


def _long_path(tj):
    tj["frames"][0]["file_path"] = LONG + ".png"


def _scene_copy(root: Path, name: str, edit=None, records: bool = True) -> Path:
    """A copy of the seed scene folder; ``edit(folder)`` changes it; ``records=False`` drops rh3dgs.json's
    file records (so that a file's own reader, not the checksum, meets the change)."""
    d = root / name
    shutil.copytree(seed_dir() / "scene", d)
    if not records:
        meta = json.loads((d / "rh3dgs.json").read_text())
        meta.pop("files")
        (d / "rh3dgs.json").write_text(json.dumps(meta))
    if edit:
        edit(d)
    return d


def _flip_byte(name: str, at: int = -40):
    def edit(d: Path):
        b = bytearray((d / name).read_bytes())
        b[at] ^= 0x01
        (d / name).write_bytes(bytes(b))
    return edit


def _set_json(**kw):
    def edit(d: Path):
        meta = json.loads((d / "rh3dgs.json").read_text())
        meta.update(kw)
        (d / "rh3dgs.json").write_text(json.dumps(meta))
    return edit


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> path of every broken input (and a few good ones), made once."""
    root = tmp_path_factory.mktemp("bad")
    seeds = seed_dir()
    f = {"ply": seeds / "scene.ply", "data": seeds / "data", "scene": seeds / "scene", "root": root}
    (root / "garbage.ply").write_bytes(b"not a ply at all")
    good = (seeds / "scene.ply").read_bytes()
    (root / "trunc.ply").write_bytes(good[: len(good) - 7])
    head = good[: good.index(b"end_header\n") + len(b"end_header\n")].decode("latin-1")
    (root / "empty.ply").write_bytes(head.replace("element vertex 4", "element vertex 0").encode("latin-1"))
    (root / "huge.ply").write_bytes(head.replace("element vertex 4", "element vertex 1000000000000")
                                    .encode("latin-1") + b"\0" * 64)
    (root / "afile").write_text("a plain file")
    (root / "outdir").mkdir()
    for k in ("garbage", "trunc", "empty", "huge"):
        f[k] = root / f"{k}.ply"
    f["noimg"] = _dataset(root, "noimg", image=False)
    f["badsize"] = _dataset(root, "badsize", _set(w=8, h=6))
    f["nanpose"] = _dataset(root, "nanpose", lambda tj: tj["frames"][0]["transform_matrix"][0].__setitem__(3, float("nan")))
    f["nointr"] = _dataset(root, "nointr", lambda tj: tj.pop("fl_x"))
    f["noframes"] = _dataset(root, "noframes", _set(frames=[]))
    f["big"] = _dataset(root, "big", _set(w=40000, h=40000))
    fmap = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    f["many"] = _with_features(_dataset(root, "many", lambda tj: (_frames(120_000)(tj), tj.update(w=64, h=64))), fmap)
    f["longname"] = _with_features(_dataset(root, "longname", _long_path), fmap)
    nan = fmap.copy()
    nan[1, 2, 0] = np.nan
    f["nanfeat"] = _with_features(_dataset(root, "nanfeat"), nan)
    f["zerofeat"] = _with_features(_dataset(root, "zerofeat"), np.zeros_like(fmap))
    f["featshape"] = _with_features(_dataset(root, "featshape"), fmap[None])
    f["nofeat"] = _dataset(root, "nofeat")
    f["goodfeat"] = _with_features(_dataset(root, "goodfeat"), fmap)
    hugemap = _dataset(root, "hugemap")
    (hugemap / "features").mkdir()
    with open(hugemap / "features" / "img0.npy", "wb") as fh:  # a header claiming 1e5 x 1e5 x 512 floats
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (100_000, 100_000, 512)})
        fh.write(b"\0" * 64)
    f["hugemap"] = hugemap
    broken = root / "brokenscene"
    shutil.copytree(seeds / "scene", broken)
    (broken / "field.npz").write_bytes(b"PK\x03\x04 truncated")
    f["brokenscene"] = broken
    noply = root / "noplyscene"
    shutil.copytree(seeds / "scene", noply)
    (noply / "semantic.ply").unlink()
    f["noplyscene"] = noply
    (root / "badpreset.yaml").write_text("delta: [1, 2\n")
    (root / "unknownkey.yaml").write_text("deltaa: 0.3\n")
    # ---- reliability round 3: reads sized before they are made, integrity, collisions
    npzmap = _dataset(root, "npzmap")
    (npzmap / "features").mkdir()
    shutil.copy(seeds / "text_embeddings.npz", npzmap / "features" / "text_embeddings.npz")
    _inflating_npz(npzmap / "features" / "img0.npz", "features", (1024, 1024, 64), np.float16)  # 128 MB inflated
    f["npzmap"] = npzmap
    bombtext = _with_features(_dataset(root, "bombtext"), fmap)
    _inflating_npz(bombtext / "features" / "text_embeddings.npz", "red mug", (1 << 25,), np.float32,
                   {"chair": np.ones(5, np.float32)})  # 128 MB inflated
    f["bombtext"] = bombtext
    f["bombfield"] = _scene_copy(root, "bombfield", lambda d: _inflating_npz(
        d / "field.npz", "decoder", (1 << 14, 1 << 11), np.float32), records=False)
    bigpng = _dataset(root, "bigpng", image=False)
    _png_claiming(bigpng / "img0.png", 40000, 40000)
    f["bigpng"] = bigpng
    f["flippedply"] = _scene_copy(root, "flippedply", _flip_byte("semantic.ply"))
    f["flippedfield"] = _scene_copy(root, "flippedfield", _flip_byte("field.npz", 200))
    f["newerscene"] = _scene_copy(root, "newerscene", _set_json(version=99))
    from rh3dgs.teachers import TeacherConfig
    from rh3dgs.teachers.cache import teacher_cache_dir

    tiny = TeacherConfig(name="tiny-clip").setup(seeds / "data")
    newer = teacher_cache_dir(tiny, root / "newcache")  # the entry folder extract uses, its manifest from the future
    newer.mkdir(parents=True)
    (newer / "manifest.json").write_text(json.dumps({"format": 99, "teacher_key": tiny.cache_key(), "entries": {}}))
    f["newcache"] = root / "newcache"
    twins = _with_features(_dataset(root, "twins", lambda tj: tj["frames"].append(
        {**tj["frames"][0], "file_path": "b/img0.png"})), fmap)
    (twins / "b").mkdir()
    shutil.copy(seeds / "data" / "img0.png", twins / "b" / "img0.png")
    f["twins"] = twins
    return f


def _cases(f, out="OUT"):
    """(case id, argv, fragments the error line must contain); ``out``: an output path that must stay unwritten."""
    R = f["root"]
    out = str(out)
    ply, data, scene = str(f["ply"]), str(f["data"]), str(f["scene"])
    d = _Str(f)
    return [
        # ---- the command line itself
        ("no command", [], ["command"]),
        ("unknown command", ["frobnicate"], ["frobnicate"]),
        ("unknown option", ["render", ply, "--transforms", data, "--output", out, "--bogus"], ["--bogus"]),
        ("missing required option", ["lift", ply, "--output", out], ["--data"]),
        ("missing positional", ["query", "--output", out], ["query"]),
        ("int option not an int", ["synth", "--output", out, "--views", "abc"], ["--views", "abc"]),
        ("synth --views 0 (fuzzer)", ["synth", "--output", out, "--views", "0"], ["--views"]),
        ("synth --size 1e6", ["synth", "--output", out, "--size", "1000000"], ["memory estimate"]),
        ("float option not a float", ["lift", ply, "--data", data, "--output", out, "--delta", "x"], ["--delta"]),
        ("choice not allowed", ["lift", ply, "--data", data, "--output", out, "--method", "mean"], ["--method", "mean"]),
        ("bad --max-memory", ["--max-memory", "lots", "render", ply, "--transforms", data, "--output", out],
         ["--max-memory", "lots"]),
        ("--max-memory too small", ["--max-memory", "1K", "render", ply, "--transforms", data, "--output", out],
         ["memory estimate"]),
        ("negative delta", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--delta", "-1"], ["delta"]),
        ("zero downscale", ["render", ply, "--transforms", data, "--output", out, "--downscale", "0"], ["downscale"]),
        ("lift preset missing", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--config", str(R / "nope.yaml")],
         ["nope.yaml"]),
        ("lift preset not YAML", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--config", str(R / "badpreset.yaml")],
         ["badpreset.yaml"]),
        ("lift preset unknown key", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--config",
                                     str(R / "unknownkey.yaml")], ["deltaa"]),
        ("eval: neither scene nor suite", ["eval"], ["--suite"]),
        ("eval: bad --layouts", ["eval", "--suite", "synthetic", "--layouts", "a,b", "--output", out], ["--layouts"]),
        # ---- PLY files
        ("missing PLY", ["render", str(R / "nope.ply"), "--transforms", data, "--output", out], ["nope.ply", "not found"]),
        ("PLY that is not a PLY", ["render", d["garbage"], "--transforms", data, "--output", out], ["garbage.ply"]),
        ("truncated PLY", ["render", d["trunc"], "--transforms", data, "--output", out], ["trunc.ply"]),
        ("PLY with 0 vertices: lift", ["lift", d["empty"], "--data", d["goodfeat"], "--output", out], ["empty.ply"]),
        ("PLY header of 1e12 vertices", ["render", d["huge"], "--transforms", data, "--output", out],
         ["huge.ply", "memory estimate"]),
        # ---- transforms.json and images
        ("no transforms.json", ["render", ply, "--transforms", str(R / "outdir"), "--output", out], ["transforms.json"]),
        ("images missing", ["extract", "--data", d["noimg"], "--teacher", "tiny-clip"], ["img0.png"]),
        ("image size != transforms w/h", ["extract", "--data", d["badsize"], "--teacher", "tiny-clip"], ["img0.png"]),
        ("NaN pose", ["render", ply, "--transforms", d["nanpose"], "--output", out], ["transform_matrix", "nan"]),
        ("no intrinsics", ["render", ply, "--transforms", d["nointr"], "--output", out], ["transforms.json", "fl_x"]),
        ("no frames", ["render", ply, "--transforms", d["noframes"], "--output", out], ["transforms.json", "frames"]),
        ("40000x40000 images", ["render", ply, "--transforms", d["big"], "--output", out], ["memory estimate"]),
        ("120k frames", ["--max-memory", "1G", "lift", ply, "--data", d["many"], "--output", out],
         ["120000 views", "memory estimate", "--streaming"]),
        ("image name too long: lift", ["lift", ply, "--data", d["longname"], "--output", out], [LONG[:40]]),
        ("image name too long: extract", ["extract", "--data", d["longname"], "--teacher", "tiny-clip",
                                          "--cache", str(R / "cache_long")], [LONG[:40]]),
        # ---- teacher features and models
        ("NaN in a feature map", ["lift", ply, "--data", d["nanfeat"], "--output", out, "--frame", "data"], ["img0.npy", "pixel (y=1, x=2)"]),
        ("zero-norm feature map", ["lift", ply, "--data", d["zerofeat"], "--output", out, "--frame", "data"], ["img0.npy"]),
        ("feature map of the wrong shape", ["lift", ply, "--data", d["featshape"], "--output", out, "--frame", "data"], ["img0.npy"]),
        ("features folder missing", ["lift", ply, "--data", d["nofeat"], "--output", out], ["features"]),
        ("1e5 x 1e5 teacher map", ["lift", ply, "--data", d["hugemap"], "--output", out],
         ["img0.npy", "memory estimate"]),
        ("unknown teacher", ["extract", "--data", data, "--teacher", "dino"], ["dino"]),
        ("missing checkpoint", ["extract", "--data", data, "--teacher", "clip", "--checkpoint", str(R / "ckpt.pt"),
                                "--cache", str(R / "cache_ck")], ["ckpt.pt"]),
        # ---- scene folders and queries
        ("not a scene folder", ["query", str(R / "outdir"), "red mug", "--output", out], ["outdir", "rh3dgs.json"]),
        ("corrupt field.npz", ["query", d["brokenscene"], "red mug", "--output", out], ["field.npz"]),
        ("scene without semantic.ply", ["query", d["noplyscene"], "red mug", "--output", out], ["semantic.ply"]),
        ("unknown query", ["select", scene, "purple elephant", "--output", str(R / "sel.ply")], ["purple elephant"]),
        ("empty query", ["query", scene, " ; ", "--output", out], ["no query"]),
        ("very long query", ["select", scene, "mug " * 5000, "--output", str(R / "sel.ply")], ["no text embedding"]),
        ("--views abc", ["query", scene, "red mug", "--views", "abc", "--output", out], ["--views", "abc"]),
        ("--views empty", ["query", scene, "red mug", "--views", "", "--output", out], ["--views"]),
        ("--views out of range", ["query", scene, "red mug", "--views", "7", "--output", out], ["--views", "7"]),
        ("--threshold not a number", ["select", scene, "red mug", "--threshold", "high", "--output", out],
         ["--threshold"]),
        # ---- outputs
        ("select --output is a folder", ["select", scene, "red mug", "--negatives", "chair", "--output", str(R / "outdir")], ["outdir", "folder"]),
        ("export --output is a folder", ["export", scene, "--output", str(R / "outdir")], ["outdir", "folder"]),
        ("select --output unwritable", ["select", scene, "red mug", "--negatives", "chair", "--output", "/proc/x.ply"], ["/proc/x.ply"]),
        ("export --output unwritable", ["export", scene, "--output", "/proc/x.ply"], ["/proc/x.ply"]),
        ("select --output under a file", ["select", scene, "red mug", "--negatives", "chair", "--output", str(R / "afile" / "x.ply")],
         ["afile"]),
        ("export --output under a file", ["export", scene, "--output", str(R / "afile" / "x.ply")], ["afile"]),
        ("export --output name too long", ["export", scene, "--output", str(R / (LONG + ".ply"))], [LONG[:40]]),
        ("render --output under a file", ["render", ply, "--transforms", data, "--output", str(R / "afile" / "r")],
         ["afile"]),
        ("select over the scene's own PLY", ["select", scene, "red mug", "--negatives", "chair", "--output", str(f["scene"] / "semantic.ply"),
                                             "--overwrite"], ["semantic.ply"]),
        ("lift into the dataset", ["lift", ply, "--data", d["nanfeat"], "--output", d["nanfeat"], "--overwrite"],
         ["nanfeat"]),
        ("view a missing path", ["view", str(R / "nowhere")], ["nowhere"]),
        # ---- reliability round 3 (issue 41): sized reads, integrity, collisions
        (".npz map inflating to 128 MB, --max-memory 64M", ["--max-memory", "64M", "lift", ply, "--data", d["npzmap"],
                                                           "--output", out, "--frame", "data"],
         ["img0.npz", "features 1024x1024x64 float16", "memory estimate"]),
        ("text_embeddings.npz member of 128 MB", ["--max-memory", "64M", "lift", ply, "--data", d["bombtext"],
                                                  "--output", out, "--frame", "data"],
         ["text_embeddings.npz", "red mug 33554432 float32", "memory estimate"]),
        ("field.npz entry of 128 MB", ["--max-memory", "64M", "export", d["bombfield"], "--output", out],
         ["field.npz", "decoder 16384x2048 float32", "memory estimate"]),
        ("PNG header of 40000x40000: extract", ["extract", "--data", d["bigpng"], "--teacher", "tiny-clip",
                                                "--cache", str(R / "cache_png")], ["img0.png", "decompression bomb"]),
        ("synth --views 10000000", ["--max-memory", "8G", "synth", "--output", out, "--views", "10000000"],
         ["10000000", "memory estimate"]),
        ("a flipped byte in semantic.ply", ["export", d["flippedply"], "--output", out],
         ["semantic.ply", "changed since rh3dgs wrote the scene"]),
        ("a flipped byte in field.npz", ["select", d["flippedfield"], "red mug", "--output", out],
         ["field.npz", "changed since rh3dgs wrote the scene"]),
        ("scene version newer than the reader", ["export", d["newerscene"], "--output", out],
         ["rh3dgs.json [version]", "newer rh3dgs"]),
        ("cache manifest of a newer format", ["extract", "--data", data, "--teacher", "tiny-clip", "--cache",
                                              d["newcache"]], ["manifest.json [format]", "newer rh3dgs"]),
        # ---- numbers that are not numbers (rh3dgs.ranges: the option as typed, the rule, the value)
        ("select --threshold nan", ["select", scene, "red mug", "--threshold", "nan", "--output", out],
         ["--threshold", "nan"]),
        ("query --threshold 2", ["query", scene, "red mug", "--threshold", "2", "--output", out], ["--threshold", "2"]),
        ("lift --latent-dim 0", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--latent-dim", "0"],
         ["--latent-dim", "got 0"]),
        ("lift --tile-size 0", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--tile-size", "0"],
         ["--tile-size", "got 0"]),
        ("lift --fill-neighbors 0", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--fill-neighbors", "0"],
         ["--fill-neighbors", "got 0"]),
        ("lift --min-coverage nan", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--min-coverage", "nan"],
         ["--min-coverage", "nan"]),
        ("lift --fill-radius nan", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--fill-radius", "nan"],
         ["--fill-radius", "nan"]),
        ("lift --vcd.edge-radius -1", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--vcd.edge-radius", "-1"],
         ["--vcd.edge-radius", "got -1"]),
        ("lift --delta inf", ["lift", ply, "--data", d["goodfeat"], "--output", out, "--delta", "inf"],
         ["--delta", "inf"]),
        ("synth --fov-deg 180", ["synth", "--output", out, "--fov-deg", "180"], ["--fov-deg", "< 180"]),
        ("synth --orbit-heights with no value", ["synth", "--output", out, "--orbit-heights"], ["--orbit-heights"]),
        ("synth --gaussians-per-unit-area nan", ["synth", "--output", out, "--gaussians-per-unit-area", "nan"],
         ["--gaussians-per-unit-area", "nan"]),
        ("view --port 70000", ["view", scene, "--port", "70000"], ["--port", "65535"]),
        ("extract --batch-size 0", ["extract", "--data", data, "--teacher", "tiny-clip", "--batch-size", "0"],
         ["--batch-size", "got 0"]),
        ("two images of one name, one feature map", ["lift", ply, "--data", d["twins"], "--output", out, "--frame",
                                                     "data"], ["img0.npy", "two different images"]),
    ]


class _Str:
    def __init__(self, f):
        self.f = f

    def __getitem__(self, key):
        return str(self.f[key])


class _AnyPath(dict):
    def __missing__(self, key):
        return Path("/x")


CASES = [c[0] for c in _cases(_AnyPath())]


@pytest.mark.parametrize("case", CASES)
def test_one_line_naming_the_problem(case, files, capsys, tmp_path):
    out = tmp_path / "out_never_written"
    _, argv, needles = next(c for c in _cases(files, out) if c[0] == case)
    before = _tree(files["root"])
    code = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert code == 2, (code, cap.err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("rh3dgs: error: "), cap.err[-2000:]
    for s in needles:
        assert s in lines[0], (s, lines[0])
    assert _tree(files["root"]) == before  # a refused job writes nothing
    assert not out.exists()


def _tree(root: Path):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*")
                  if p.is_file() and "cache" not in p.parts[len(root.parts)])
