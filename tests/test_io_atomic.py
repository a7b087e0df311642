"""Atomic output: no partial files, no leftovers, old files untouched on failure."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs.errors import NonFiniteError, ShapeError
from rh3dgs.io.atomic import (
    atomic_save_bytes,
    atomic_save_json,
    atomic_save_npz,
    atomic_save_png,
    atomic_save_text,
    atomic_write,
)


class Boom(Exception):
    pass


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_exception_leaves_no_file_and_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(Boom):
        with atomic_write(target) as f:
            f.write(b"partial data" * 1000)
            raise Boom()
    assert listing(tmp_path) == []


def test_exception_keeps_existing_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old content")
    with pytest.raises(Boom):
        with atomic_write(target, "w") as f:
            f.write("new")
            f.flush()
            # the destination is untouched while writing
            assert target.read_text() == "old content"
            raise Boom()
    assert target.read_text() == "old content"
    assert listing(tmp_path) == ["out.txt"]


def test_keyboard_interrupt_is_cleaned_up_too(tmp_path):
    target = tmp_path / "k.bin"
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as f:
            f.write(b"x")
            raise KeyboardInterrupt
    assert listing(tmp_path) == []


def test_success_replaces_and_leaves_only_target(tmp_path):
    target = tmp_path / "sub" / "dir" / "out.bin"  # parents are created
    with atomic_write(target) as f:
        f.write(b"one")
    with atomic_write(target) as f:
        f.write(b"two")
    assert target.read_bytes() == b"two"
    assert listing(target.parent) == ["out.bin"]


def test_body_may_close_the_file(tmp_path):
    target = tmp_path / "c.bin"
    with atomic_write(target) as f:
        f.write(b"abc")
        f.close()
    assert target.read_bytes() == b"abc"


def test_permissions_follow_umask(tmp_path):
    target = tmp_path / "perm.txt"
    atomic_save_text(target, "hi")
    old = os.umask(0)
    os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~old


def test_bad_mode_and_directory_target(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(tmp_path / "a", "ab"):
            pass
    with pytest.raises(IsADirectoryError):
        with atomic_write(tmp_path):
            pass
    assert listing(tmp_path) == []


def test_text_mode_newlines_and_encoding(tmp_path):
    p = atomic_save_text(tmp_path / "t.txt", "a\nb\u00e9\n")
    assert p.read_bytes() == "a\nb\u00e9\n".encode("utf-8")


def test_save_bytes(tmp_path):
    p = atomic_save_bytes(tmp_path / "b.bin", b"\x00\x01\xff")
    assert p.read_bytes() == b"\x00\x01\xff"


def test_save_json(tmp_path):
    obj = {"a": np.float32(1.5), "b": np.arange(3), "t": torch.tensor([1.0, 2.0]), "p": tmp_path, "n": np.int64(7)}
    p = atomic_save_json(tmp_path / "j.json", obj)
    assert json.loads(p.read_text()) == {"a": 1.5, "b": [0, 1, 2], "t": [1.0, 2.0], "p": str(tmp_path), "n": 7}
    # an unserialisable value fails before the old file is touched
    with pytest.raises(TypeError):
        atomic_save_json(p, {"x": object()})
    assert json.loads(p.read_text())["n"] == 7
    with pytest.raises(ValueError):
        atomic_save_json(p, {"x": float("nan")}, allow_nan=False)
    assert listing(tmp_path) == ["j.json"]


def test_save_npz(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = torch.tensor([1, 2, 3], dtype=torch.int16)
    for compressed in (False, True):
        p = atomic_save_npz(tmp_path / f"arr{compressed}", {"a": a, "t": t}, compressed=compressed)
        assert p.name == f"arr{compressed}"  # no .npz appended
        with np.load(p) as z:
            assert np.array_equal(z["a"], a) and z["t"].dtype == np.int16 and z["t"].tolist() == [1, 2, 3]


def test_save_png(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    p = atomic_save_png(tmp_path / "rgb.png", rgb)
    with Image.open(p) as im:
        assert im.format == "PNG" and im.mode == "RGB" and im.size == (7, 5)
        assert np.array_equal(np.asarray(im), rgb)

    f = torch.tensor([[0.0, 0.5, 1.0], [-1.0, 2.0, 0.25]])  # clipped, rounded
    with Image.open(atomic_save_png(tmp_path / "f.png", f)) as im:
        assert im.mode == "L" and np.asarray(im).tolist() == [[0, 128, 255], [0, 255, 64]]

    rgba = np.zeros((2, 2, 4), np.float32)
    rgba[..., 3] = 1.0
    with Image.open(atomic_save_png(tmp_path / "a.png", rgba)) as im:
        assert im.mode == "RGBA" and np.asarray(im)[0, 0].tolist() == [0, 0, 0, 255]

    depth = np.array([[0, 1000], [65535, 7]], np.uint16)
    with Image.open(atomic_save_png(tmp_path / "d.png", depth)) as im:
        assert np.array_equal(np.asarray(im).astype(np.uint16), depth)

    with Image.open(atomic_save_png(tmp_path / "m.png", np.array([[True, False]]))) as im:
        assert np.asarray(im).tolist() == [[255, 0]]

    with pytest.raises(NonFiniteError):
        atomic_save_png(tmp_path / "bad.png", np.array([[0.1, np.nan]]))
    with pytest.raises(ShapeError):
        atomic_save_png(tmp_path / "bad.png", np.zeros((2, 2, 5), np.uint8))
    with pytest.raises(TypeError):
        atomic_save_png(tmp_path / "bad.png", np.zeros((2, 2), np.int32))
    assert not (tmp_path / "bad.png").exists()
