"""Fuzz targets for every rh3dgs input parser (shared by the hypothesis tests and atheris).

Each target takes raw bytes, puts them where the parser expects a user file, and calls
the parser. A target *passes* when the parser returns, or raises an
:class:`rh3dgs.errors.Rh3dgsError` subclass whose message names the file; anything else
(``TypeError``, ``IndexError``, ``MemoryError``, a segfault, a hang) is a bug.

    from fuzz.targets import TARGETS, seeds, run_one
    run_one("ply", b"ply\\nformat ascii 1.0\\n...")

The seed files are small valid inputs written by rh3dgs itself (``seeds()``), so mutation
fuzzers start from something that parses and explore the edges of the format.
"""
from __future__ import annotations

import io
import json
import shutil
import signal
import tempfile
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import torch

from rh3dgs.errors import Rh3dgsError

#: seconds one parser call may take before it counts as a hang
CALL_TIMEOUT_S = 10.0


class Hang(AssertionError):
    """A parser call ran past CALL_TIMEOUT_S."""


@contextmanager
def time_limit(seconds: float = CALL_TIMEOUT_S):
    """Raise :class:`Hang` if the block runs longer than ``seconds`` (main thread, POSIX)."""
    if seconds is None or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise Hang(f"parser call ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------- seeds
def _tiny_gaussians(n: int = 4, d: int = 2):
    from rh3dgs.gaussians import Gaussians

    g = torch.Generator().manual_seed(0)
    return Gaussians(
        means=torch.randn(n, 3, generator=g), scales=torch.randn(n, 3, generator=g) - 2,
        quats=torch.randn(n, 4, generator=g), opacities=torch.randn(n, generator=g),
        sh0=torch.randn(n, 1, 3, generator=g), shN=torch.randn(n, 3, 3, generator=g),
        latents=None if d == 0 else torch.randn(n, d, generator=g),
    )


def _png_bytes(w: int = 4, h: int = 3) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@lru_cache(maxsize=1)
def seed_dir() -> Path:
    """A folder of small valid inputs (created once per process)."""
    from rh3dgs.api import save_scene
    from rh3dgs.cameras import Cameras
    from rh3dgs.field import SemanticField
    from rh3dgs.io.ply import save_ply

    root = Path(tempfile.mkdtemp(prefix="rh3dgs_fuzz_seeds_"))
    g = _tiny_gaussians()
    save_ply(root / "scene.ply", g)
    # ASCII PLY seed (exercises the text path of the parser)
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
             "rot_0", "rot_1", "rot_2", "rot_3"]
    rows = "\n".join(" ".join(str(0.5 * (i + j)) for j in range(len(names))) for i in range(2))
    (root / "ascii.ply").write_text("ply\nformat ascii 1.0\nelement vertex 2\n"
                                    + "".join(f"property float {n}\n" for n in names) + "end_header\n" + rows + "\n")
    # a transforms.json with one 4x3 image
    (root / "data").mkdir()
    (root / "data" / "img0.png").write_bytes(_png_bytes())
    tj = {"camera_model": "OPENCV", "w": 4, "h": 3, "fl_x": 5.0, "fl_y": 5.0, "cx": 2.0, "cy": 1.5,
          "k1": 0.0, "frames": [{"file_path": "img0.png",
                                 "transform_matrix": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 2], [0, 0, 0, 1]]}]}
    (root / "data" / "transforms.json").write_text(json.dumps(tj, indent=1))
    # feature files
    fmap = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    np.save(root / "feat.npy", fmap)
    np.savez(root / "feat.npz", features=fmap)
    torch.save(torch.from_numpy(fmap), root / "feat.pt")
    np.savez(root / "text_embeddings.npz", **{"red mug": np.ones(5, np.float32), "chair": np.arange(5.0)})
    # a semantic scene folder (no teacher spec: loading must not need a model)
    cams = Cameras(viewmats=torch.eye(4)[None], Ks=torch.tensor([[[5.0, 0, 2], [0, 5.0, 1.5], [0, 0, 1]]]),
                   width=4, height=3, names=["img0"])
    fld = SemanticField(g.latents, torch.randn(5, 2, generator=torch.Generator().manual_seed(1)),
                        torch.ones(len(g), dtype=torch.bool))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_scene(root / "scene", g, fld, cams, [root / "data" / "img0.png"],
                   text_embeddings={"red mug": torch.ones(5), "chair": torch.arange(5.0)})
    # real-dataset readers: a LERF-OVS label JSON, 3D-OVS poses_bounds.npy, a labelled point cloud
    lerf = {"info": {"height": 3, "width": 4, "name": "frame_00001.jpg"},
            "objects": [{"category": "mug", "bbox": [0, 0, 2, 2], "segmentation": [[0, 0], [2, 0], [2, 2], [0, 2]]}]}
    (root / "frame_00001.json").write_text(json.dumps(lerf))
    pb = np.concatenate([np.concatenate([np.eye(3), np.zeros((3, 1)), [[3.0], [4.0], [5.0]]], 1).reshape(-1),
                         [0.5, 10.0]])[None].repeat(2, 0)
    np.save(root / "poses_bounds.npy", pb)
    pts = np.zeros(3, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("label", "i4")])
    np.save(root / "points.npy", pts)
    return root


class _Seeds(dict):
    """The seeds; the heavier ones (a run config imports nerfstudio) made on first use."""

    def __missing__(self, name: str) -> bytes:
        if name == "ns_config":
            import yaml

            from rh3dgs.nerfstudio.config import rh3dgs_lite_config

            value = yaml.dump(rh3dgs_lite_config()).encode()
        elif name == "checkpoint":
            buf = io.BytesIO()
            torch.save(_checkpoint_state(), buf)
            value = buf.getvalue()
        elif name == "viewer_message":
            import msgspec

            value = msgspec.msgpack.encode({"type": "ViewerCameraMessage", "wxyz": [1.0, 0.0, 0.0, 0.0],
                                            "position": [0.0, 0.0, -3.0], "fov": 0.9, "aspect": 1.0,
                                            "look_at": [0.0, 0.0, 0.0], "up_direction": [0.0, -1.0, 0.0]})
        else:
            raise KeyError(name)
        self[name] = value
        return value


def _checkpoint_state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"step": 5, "pipeline": {"_model.gauss_params.means": torch.randn(64, 3, generator=g),
                                    "_model.decoder": torch.randn(5, 2, generator=g)}}


def seeds() -> Dict[str, bytes]:
    """Target name -> bytes of a valid input."""
    root = seed_dir()
    return _Seeds({
        "ply": (root / "scene.ply").read_bytes(),
        "ply_ascii": (root / "ascii.ply").read_bytes(),
        "transforms": (root / "data" / "transforms.json").read_bytes(),
        "feature_npy": (root / "feat.npy").read_bytes(),
        "feature_npz": (root / "feat.npz").read_bytes(),
        "feature_pt": (root / "feat.pt").read_bytes(),
        "text_embeddings": (root / "text_embeddings.npz").read_bytes(),
        "scene_json": (root / "scene" / "rh3dgs.json").read_bytes(),
        "scene_field": (root / "scene" / "field.npz").read_bytes(),
        "scene_ply": (root / "scene" / "semantic.ply").read_bytes(),
        "lerf_ovs_json": (root / "frame_00001.json").read_bytes(),
        "ovs3d_poses_bounds": (root / "poses_bounds.npy").read_bytes(),
        "scannet_points": (root / "points.npy").read_bytes(),
        "lift_preset": (Path(__file__).resolve().parents[2] / "configs" / "lift-robust.yaml").read_bytes(),
        "scene_checksum": (root / "scene" / "field.npz").read_bytes(),
    })


# ----------------------------------------------------------------------------- targets
def _ply(work: Path, data: bytes) -> None:
    from rh3dgs.io.ply import load_ply

    p = work / "in.ply"
    p.write_bytes(data)
    g = load_ply(p)
    # a loaded scene must be usable: finite standard fields of consistent shapes
    assert torch.isfinite(g.means).all() and g.means.shape == (len(g), 3)


def _transforms(work: Path, data: bytes) -> None:
    from rh3dgs.io.transforms import load_transforms

    shutil.copy(seed_dir() / "data" / "img0.png", work / "img0.png")
    (work / "transforms.json").write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cams, paths = load_transforms(work, check_images=True)
    assert torch.isfinite(cams.viewmats).all() and torch.isfinite(cams.Ks).all()
    assert len(paths) == len(cams)


def _feature(suffix: str) -> Callable[[Path, bytes], None]:
    def target(work: Path, data: bytes) -> None:
        from rh3dgs.teachers.precomputed import PrecomputedTeacher

        feats = work / "features"
        feats.mkdir()
        (feats / f"img0{suffix}").write_bytes(data)
        t = PrecomputedTeacher(features_dir=feats)
        m = t.features_for("images/img0.png", out_size=(3, 4))
        assert m.shape[:2] == (3, 4) and torch.isfinite(m).all()

    return target


def _text_embeddings(work: Path, data: bytes) -> None:
    from rh3dgs.teachers.precomputed import PrecomputedTeacher

    feats = work / "features"
    feats.mkdir()
    (feats / "text_embeddings.npz").write_bytes(data)
    t = PrecomputedTeacher(features_dir=feats)
    qs = t.text_queries()
    if qs:
        v = t.encode_text(qs[:2])
        assert torch.isfinite(v).all() and v.shape[-1] == t.dim


def _scene(which: str, records: bool = False) -> Callable[[Path, bytes], None]:
    """rh3dgs.load of the seed scene with ``which`` replaced by the bytes. Without ``records`` rh3dgs.json's
    file records are dropped first (so the file's own reader meets the bytes, not the checksum); with them,
    bytes that differ from what the scene recorded must never load."""
    def target(work: Path, data: bytes) -> None:
        import rh3dgs

        folder = work / "scene"
        shutil.copytree(seed_dir() / "scene", folder)
        if not records and which != "rh3dgs.json":
            meta = json.loads((folder / "rh3dgs.json").read_text())
            meta.pop("files", None)
            (folder / "rh3dgs.json").write_text(json.dumps(meta))
        changed = (folder / which).read_bytes() != data
        # transforms.json refers to the seed image by an absolute path; fine for check_images=False
        (folder / which).write_bytes(data)
        scene = rh3dgs.load(folder)
        assert not (records and changed), f"a changed {which} loaded although rh3dgs.json records its checksum"
        if scene.field is not None:
            rel = scene.relevancy([torch.ones(scene.field.dim)], negatives=[])
            assert torch.isfinite(rel).all()

    return target


def _lerf_ovs(work: Path, data: bytes) -> None:
    from rh3dgs.data.readers.lerf_ovs import read_lerf_label

    (work / "frame_00001.json").write_bytes(data)
    read_lerf_label(work / "frame_00001.json")


def _ovs3d_poses(work: Path, data: bytes) -> None:
    from rh3dgs.data.readers.ovs3d import llff_to_opencv_viewmats, read_poses_bounds

    (work / "poses_bounds.npy").write_bytes(data)
    poses, bounds = read_poses_bounds(work / "poses_bounds.npy")
    assert torch.isfinite(llff_to_opencv_viewmats(poses)).all()


def _scannet_points(work: Path, data: bytes) -> None:
    from rh3dgs.data.readers.scannet import read_labelled_points

    (work / "points.npy").write_bytes(data)
    read_labelled_points(work / "points.npy")


def _ns_config(work: Path, data: bytes) -> None:
    """A run's config.yml through the loader nerfstudio's own reads use once the plugin is loaded."""
    from rh3dgs.io.nerfstudio_run import parse_run_config

    (work / "config.yml").write_bytes(data)
    parse_run_config(data, work / "config.yml")


def _checkpoint(work: Path, data: bytes) -> None:
    """A checkpoint: refused, or loaded equal to what was saved (flipped bytes never load as other numbers)."""
    from rh3dgs.io.nerfstudio_run import load_checkpoint

    (work / "step-000000005.ckpt").write_bytes(data)
    state = load_checkpoint(work / "step-000000005.ckpt")
    want = _checkpoint_state()
    assert state["step"] == want["step"] and all(torch.equal(state["pipeline"][k], v)
                                                 for k, v in want["pipeline"].items()), "a damaged checkpoint loaded"


def _viewer_message(work: Path, data: bytes) -> None:
    """What a viewer's client sends: decoded and checked by the guard (never raises: a bad one is dropped)."""
    import contextlib

    from viser._messages import Message  # what viser's server decodes with

    from rh3dgs.viewer.guard import CheckedMessages, message_problem

    with contextlib.redirect_stderr(io.StringIO()):
        m = CheckedMessages(Message).deserialize(data)
    assert type(m).__name__ == "_Dropped" or message_problem(m) is None


def _lift_preset(work: Path, data: bytes) -> None:
    from rh3dgs.lifting import LiftConfig
    from rh3dgs.presets import load_preset

    (work / "preset.yaml").write_bytes(data)
    load_preset(work / "preset.yaml", LiftConfig)


TARGETS: Dict[str, Callable[[Path, bytes], None]] = {
    "ply": _ply,
    "ply_ascii": _ply,
    "transforms": _transforms,
    "feature_npy": _feature(".npy"),
    "feature_npz": _feature(".npz"),
    "feature_pt": _feature(".pt"),
    "text_embeddings": _text_embeddings,
    "scene_json": _scene("rh3dgs.json"),
    "scene_field": _scene("field.npz"),
    "scene_ply": _scene("semantic.ply"),
    "lerf_ovs_json": _lerf_ovs,
    "ovs3d_poses_bounds": _ovs3d_poses,
    "scannet_points": _scannet_points,
    "lift_preset": _lift_preset,
    "scene_checksum": _scene("field.npz", records=True),
    "ns_config": _ns_config,
    "checkpoint": _checkpoint,
    "viewer_message": _viewer_message,
}


def run_one(name: str, data: bytes, timeout: float = CALL_TIMEOUT_S) -> str:
    """Run target ``name`` on ``data``; returns "ok" or "error" (an Rh3dgsError); raises on a bug."""
    work = Path(tempfile.mkdtemp(prefix="rh3dgs_fuzz_"))
    try:
        with time_limit(timeout):
            try:
                TARGETS[name](work, data)
            except Rh3dgsError as e:
                msg = str(e)
                # the message names the offending file (every input lives under ``work``)
                assert str(work) in msg, f"{type(e).__name__} does not name the file: {msg}"
                return "error"
        return "ok"
    finally:
        shutil.rmtree(work, ignore_errors=True)
