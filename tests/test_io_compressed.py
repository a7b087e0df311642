"""rh3dgs.io.compressed: SuperSplat compressed PLYs and SPZ files through gsply, behind ``rh3dgs.load_ply``.

Round trips through gsply's writers check the decoding and SPZ's RUB -> RDF turn on made data; the splats
of ``../shared/realdata/splats`` (when present) check real files against gsply's own reading.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import rh3dgs
from rh3dgs.errors import MemoryLimitError, PlyFormatError

gsply = pytest.importorskip("gsply")

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "splats"


def _scene(n: int = 600, sh_degree: int = 1, seed: int = 0):
    """Random Gaussians as gsply's GSData (PLY conventions)."""
    r = np.random.default_rng(seed)
    q = r.normal(size=(n, 4)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k = (sh_degree + 1) ** 2 - 1
    return gsply.GSData(means=r.uniform(-2, 2, (n, 3)).astype(np.float32),
                        scales=r.uniform(-5, -1, (n, 3)).astype(np.float32), quats=q,
                        opacities=r.uniform(-3, 3, n).astype(np.float32), sh0=r.uniform(-1, 1, (n, 3)).astype(np.float32),
                        shN=r.uniform(-0.3, 0.3, (n, k, 3)).astype(np.float32) if k else None)


def test_compressed_ply_reads_as_gsply_decodes_it(tmp_path):
    d = _scene()
    gsply.plywrite(str(tmp_path / "s.compressed.ply"), d, compressed=True)
    g = rh3dgs.load_ply(tmp_path / "s.compressed.ply")
    ref = gsply.plyread(str(tmp_path / "s.compressed.ply"))
    assert len(g) == 600 and g.shN.shape == (600, 3, 3) and g.latents is None and not g.extra
    for ours, theirs in ((g.means, ref.means), (g.sh0[:, 0], ref.sh0), (g.scales, ref.scales), (g.quats, ref.quats),
                         (g.opacities, ref.opacities), (g.shN, ref.shN)):
        np.testing.assert_array_equal(ours.numpy(), np.asarray(theirs, np.float32).reshape(ours.shape))
    assert float((g.means - torch.from_numpy(d.means)).abs().max()) < 4e-3  # 11-10-11-bit positions per chunk


def test_spz_is_turned_from_rub_to_the_ply_frame(tmp_path):
    """An SPZ holds RUB coordinates: a scene written in RUB (gsply writes what it is given) reads back as the PLY
    scene, means, rotations (as rotations: q ~ -q) and SH bands."""
    d = _scene(sh_degree=1)
    rub = gsply.GSData(means=d.means * np.float32([1, -1, -1]), scales=d.scales,
                       quats=d.quats * np.float32([1, 1, -1, -1]), opacities=d.opacities, sh0=d.sh0,
                       shN=d.shN * np.float32([-1, -1, 1])[None, :, None])  # degree 1: the y, z, x terms
    gsply.write_spz(str(tmp_path / "s.spz"), rub, version=3)
    g = rh3dgs.load_ply(tmp_path / "s.spz")
    assert len(g) == 600
    np.testing.assert_allclose(g.means.numpy(), d.means, atol=5e-4)
    np.testing.assert_allclose(g.sh0[:, 0].numpy(), d.sh0, atol=0.02)
    dots = (torch.nn.functional.normalize(g.quats, dim=-1) * torch.from_numpy(d.quats)).sum(-1).abs()
    assert float(dots.min()) > 0.99
    np.testing.assert_allclose(g.shN.numpy(), d.shN, atol=0.02)


def test_corrupt_and_oversized_files_name_the_file(tmp_path):
    d = _scene(300, sh_degree=0)
    good = tmp_path / "s.compressed.ply"
    gsply.plywrite(str(good), d, compressed=True)
    raw = good.read_bytes()
    (tmp_path / "cut.ply").write_bytes(raw[: len(raw) - 500])
    with pytest.raises(PlyFormatError, match=r"cut\.ply.*(truncated|ends early)"):
        rh3dgs.load_ply(tmp_path / "cut.ply")
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    header = raw[:end].replace(b"element vertex 300", b"element vertex 90000000000")
    (tmp_path / "huge.ply").write_bytes(header + raw[end:])
    with pytest.raises((PlyFormatError, MemoryLimitError), match=r"huge\.ply"):
        rh3dgs.load_ply(tmp_path / "huge.ply")
    body = bytearray(raw)
    body[end:end + 4] = struct.pack("<f", float("nan"))  # chunk 0's min_x
    (tmp_path / "nan.ply").write_bytes(bytes(body))
    with pytest.raises(PlyFormatError, match=r"nan\.ply \[x y z\]: .*NaN / Inf"):
        rh3dgs.load_ply(tmp_path / "nan.ply")
    gsply.write_spz(str(tmp_path / "s.spz"), d, version=3)
    import gzip

    payload = bytearray(gzip.decompress((tmp_path / "s.spz").read_bytes()))
    payload[8:12] = struct.pack("<I", 4_000_000_000)  # points
    (tmp_path / "big.spz").write_bytes(gzip.compress(bytes(payload)))
    with pytest.raises((PlyFormatError, MemoryLimitError), match=r"big\.spz"):
        rh3dgs.load_ply(tmp_path / "big.spz")
    (tmp_path / "junk.spz").write_bytes(b"\x1f\x8bnot gzip at all")
    with pytest.raises(PlyFormatError, match=r"junk\.spz: not a readable SPZ"):
        rh3dgs.load_ply(tmp_path / "junk.spz")


@pytest.mark.parametrize("name,count", [("biker.compressed.ply", 152_746), ("guitar.compressed.ply", 90_854),
                                        ("biker.spz", 152_746)])
def test_real_splats_match_gsplys_reading(name, count, tmp_path):
    """The splats users download (realdata/splats): the Gaussian counts, and means and colours equal to gsply's
    reading (SPZ: gsply's read_spz turned from RUB; and biker.spz lines up with biker.compressed.ply); `rh3dgs
    render` of each, without cameras, writes an orbit."""
    path = REALDATA / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared/realdata is not part of the repository)")
    if name.endswith(".spz"):
        pytest.importorskip("zstandard", reason="biker.spz is SPZ version 4 (zstd): needs the zstandard package")
    g = rh3dgs.load_ply(path)
    assert len(g) == count
    ref = gsply.read_spz(str(path)) if name.endswith(".spz") else gsply.plyread(str(path))
    flip = np.float32([1, -1, -1]) if name.endswith(".spz") else np.float32([1, 1, 1])
    np.testing.assert_array_equal(g.means.numpy(), ref.means * flip)
    np.testing.assert_array_equal(g.sh0[:, 0].numpy(), ref.sh0)
    assert bool(torch.isfinite(g.means).all()) and not bool(torch.isnan(g.opacities).any())
    if name == "biker.spz":
        other = rh3dgs.load_ply(REALDATA / "biker.compressed.ply")
        assert float((g.means - other.means).abs().max()) < 2e-4
    from rh3dgs.cli import main

    assert main(["render", str(path), "--output", str(tmp_path / "orbit"), "--orbit", "3", "--size", "48"]) == 0
    import imageio.v3 as iio

    frames = iio.imread(tmp_path / "orbit" / "turntable.gif")
    assert frames.shape == (3, 48, 48, 3) and frames.max() > 50  # the splat is in view
