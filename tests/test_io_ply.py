"""PLY I/O: bit-exact round trips, INRIA compatibility, and clear errors on bad files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from rh3dgs.errors import InputFileError, NonFiniteError, PlyFormatError, ShapeError
from rh3dgs.gaussians import Gaussians
from rh3dgs.io.ply import load_ply, ply_field_names, save_ply


def wide_floats(rng: np.random.Generator, shape) -> np.ndarray:
    """Finite float32 values spanning many magnitudes and both signs (incl. 0, -0, subnormals)."""
    mant = rng.uniform(-1.0, 1.0, size=shape)
    expo = rng.integers(-40, 38, size=shape).astype(np.float64)
    a = (mant * 10.0**expo).astype(np.float32)
    flat = a.reshape(-1)
    if flat.size >= 4:
        flat[0], flat[1], flat[2], flat[3] = 0.0, -0.0, np.float32(1e-45), np.finfo(np.float32).max
    assert np.isfinite(a).all()
    return a


def wide_halfs(rng: np.random.Generator, shape) -> np.ndarray:
    """float32 values that are exactly float16 values, over the whole float16 range (incl. 0, -0, subnormals, +-65504)."""
    bits = rng.integers(0, 2**16, size=shape, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBBFF  # no Inf / NaN exponent
    a = bits.view(np.float16).astype(np.float32)
    flat = a.reshape(-1)
    if flat.size >= 6:
        flat[:6] = [0.0, -0.0, 2.0**-24, 65504.0, -65504.0, 1.0]
    assert np.isfinite(a).all()
    return a


def random_gaussians(n: int, sh_degree: int, n_latents: int = 0, seed: int = 0, extra=None,
                     half_latents: bool = True) -> Gaussians:
    """Wide float32 standard fields; latents exactly float16-representable unless ``half_latents=False``."""
    rng = np.random.default_rng(seed)
    k = (sh_degree + 1) ** 2 - 1
    t = lambda *s: torch.from_numpy(wide_floats(rng, s))  # noqa: E731
    lat = (lambda *s: torch.from_numpy(wide_halfs(rng, s))) if half_latents else t  # noqa: E731
    return Gaussians(
        means=t(n, 3),
        scales=t(n, 3),
        quats=t(n, 4),
        opacities=t(n),
        sh0=t(n, 1, 3),
        shN=t(n, k, 3),
        latents=lat(n, n_latents) if n_latents else None,
        extra=dict(extra or {}),
    )


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    an, bn = a.detach().cpu().numpy(), b.detach().cpu().numpy()
    return an.dtype == bn.dtype and an.shape == bn.shape and an.tobytes() == bn.tobytes()


def assert_bit_exact(g: Gaussians, h: Gaussians) -> None:
    for name in ("means", "scales", "quats", "opacities", "sh0", "shN"):
        assert same_bits(getattr(g, name), getattr(h, name)), name
    if g.latents is None:
        assert h.latents is None
    else:
        assert same_bits(g.latents, h.latents)
    assert list(g.extra) == list(h.extra)
    for k in g.extra:
        assert same_bits(g.extra[k], h.extra[k]), k


def vertex_names(path) -> list:
    return [p.name for p in PlyData.read(str(path))["vertex"].properties]


def header_of(path) -> str:
    raw = path.read_bytes()
    return raw[: raw.index(b"end_header")].decode("ascii")


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("sh_degree", [0, 1, 2, 3])
@pytest.mark.parametrize("n_latents", [0, 5])
@pytest.mark.parametrize("latent_dtype", ["float16", "float32"])
def test_round_trip_bit_exact(tmp_path, sh_degree, n_latents, latent_dtype):
    half = latent_dtype == "float16"
    g = random_gaussians(37, sh_degree, n_latents, seed=sh_degree * 10 + n_latents, half_latents=half)
    p = tmp_path / "scene.ply"
    assert save_ply(p, g, latent_dtype=latent_dtype) == p
    h = load_ply(p)
    assert h.sh_degree == sh_degree
    assert_bit_exact(g, h)
    assert h.latents is None or h.latents.dtype == torch.float32
    assert vertex_names(p) == ply_field_names(sh_degree, n_latents)
    # header: binary little-endian, float32 everywhere but float16 latents (ushort + comment)
    raw = p.read_bytes()
    header = header_of(p)
    assert "format binary_little_endian 1.0" in header
    assert "element vertex 37" in header
    props = [line for line in header.splitlines() if line.startswith("property")]
    sem_type = "ushort" if half else "float"
    assert all(line.startswith(f"property {sem_type if ' sem_' in line else 'float'} ") for line in props)
    assert ("comment rh3dgs sem_dtype float16" in header) == (half and n_latents > 0)
    # second trip: byte-identical file (float16 values survive load -> save exactly)
    p2 = tmp_path / "again.ply"
    save_ply(p2, h, latent_dtype=latent_dtype)
    assert p2.read_bytes() == raw
    assert_bit_exact(g, load_ply(p2))


def test_latents_float32_by_default_float16_compact(tmp_path):
    """Default: float32 latents as PLY float under the float32 marker. Compact (rh3dgs-only) float16:
    any float32 latents are stored rounded to the nearest float16 and come back as float32."""
    n, d = 300, 16
    g = random_gaussians(n, 1, 0, seed=3)
    lat = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    lat[0, :4] = torch.tensor([65504.0, -65504.0, 1e-8, -0.0])  # extremes; 1e-8 flushes to 0
    g.latents = lat
    p3 = save_ply(tmp_path / "f.ply", g)
    assert "comment rh3dgs sem_dtype float32" in header_of(p3) and "property float sem_0" in header_of(p3)
    assert "ushort" not in header_of(p3)
    assert same_bits(load_ply(p3).latents, lat)
    p = save_ply(tmp_path / "h.ply", g, latent_dtype="float16")
    header = header_of(p)
    assert "comment rh3dgs sem_dtype float16" in header and "property ushort sem_15" in header
    h = load_ply(p)
    assert h.latents.dtype == torch.float32
    assert same_bits(h.latents, lat.half().float())
    assert torch.equal(h.latents[0, :4], torch.tensor([65504.0, -65504.0, 0.0, -0.0]))
    assert (h.latents - lat).abs().max() <= 2.0**-11 * lat.abs().max()
    raw = PlyData.read(str(p))["vertex"]["sem_3"]
    assert raw.dtype == np.dtype("<u2") and np.array_equal(raw.view(np.float16).astype(np.float32), h.latents[:, 3].numpy())
    # load -> save -> load is bit-exact, the file byte-identical
    p2 = save_ply(tmp_path / "h2.ply", h, latent_dtype="float16")
    assert p2.read_bytes() == p.read_bytes()
    assert_bit_exact(h, load_ply(p2))
    # torch / numpy dtypes are accepted as well; anything else is refused
    assert save_ply(tmp_path / "t.ply", g, latent_dtype=torch.float16).read_bytes() == p.read_bytes()
    assert save_ply(tmp_path / "t.ply", g, latent_dtype=np.float32).read_bytes() == p3.read_bytes()
    with pytest.raises(ValueError, match="latent_dtype"):
        save_ply(tmp_path / "x.ply", g, latent_dtype="bfloat16")
    assert not (tmp_path / "x.ply").exists()


@pytest.mark.parametrize("sh_degree,d", [(0, 16), (3, 16), (3, 0), (1, 7)])
def test_file_size_per_gaussian(tmp_path, sh_degree, d):
    from rh3dgs.memory import ply_bytes_per_gaussian

    n = 1000
    g = random_gaussians(n, sh_degree, d, seed=1)
    sizes = {}
    for dt in ("float16", "float32"):
        p = save_ply(tmp_path / f"{dt}.ply", g, latent_dtype=dt)
        data_bytes = p.stat().st_size - len(header_of(p)) - len("end_header\n")
        assert data_bytes == n * ply_bytes_per_gaussian(sh_degree, d, dt)
        sizes[dt] = data_bytes // n
    k = (sh_degree + 1) ** 2 - 1
    assert sizes["float32"] == 4 * (14 + 3 * k + d)
    assert sizes["float16"] == sizes["float32"] - 2 * d  # 2 bytes saved per latent
    if (sh_degree, d) == (3, 16):
        assert (sizes["float16"], sizes["float32"]) == (268, 300)


def test_round_trip_with_extra_fields_keeps_dtype_and_order(tmp_path):
    n = 20
    rng = np.random.default_rng(3)
    extra = {
        "nx": torch.from_numpy(wide_floats(rng, (n,))),
        "ny": torch.zeros(n),
        "nz": torch.from_numpy(wide_floats(rng, (n,))),
        "red": torch.from_numpy(rng.integers(0, 256, n).astype(np.uint8)),
        "my_id": torch.from_numpy(rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32)),
        "weight64": torch.from_numpy(rng.normal(size=n) * 1e200),  # float64 stays float64
        "u16": torch.from_numpy(rng.integers(0, 2**16, n).astype(np.uint16)),
    }
    g = random_gaussians(n, 2, 4, seed=5, extra=extra)
    p = tmp_path / "x.ply"
    save_ply(p, g)
    h = load_ply(p)
    assert_bit_exact(g, h)
    assert h.extra["weight64"].dtype == torch.float64
    assert h.extra["red"].dtype == torch.uint8
    names = vertex_names(p)
    assert names[:6] == ["x", "y", "z", "nx", "ny", "nz"]
    assert names[-4:] == ["sem_0", "sem_1", "sem_2", "sem_3"]
    i_rot3 = names.index("rot_3")
    assert names[i_rot3 + 1 : i_rot3 + 5] == ["red", "my_id", "weight64", "u16"]
    props = {pp.name: pp.val_dtype for pp in PlyData.read(str(p))["vertex"].properties}
    assert props["weight64"] == "f8" and props["red"] == "u1" and props["my_id"] == "i4" and props["u16"] == "u2"


def test_mask_writes_only_selection(tmp_path):
    g = random_gaussians(10, 1, 3, seed=1, extra={"nx": torch.arange(10, dtype=torch.float32)})
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[1, 4, 9]] = True
    p = tmp_path / "sel.ply"
    save_ply(p, g, mask=mask)
    h = load_ply(p)
    assert len(h) == 3
    assert_bit_exact(g[mask], h)
    assert h.extra["nx"].tolist() == [1.0, 4.0, 9.0]
    with pytest.raises(ShapeError):
        save_ply(tmp_path / "bad.ply", g, mask=torch.ones(9, dtype=torch.bool))
    with pytest.raises(ShapeError):
        save_ply(tmp_path / "bad.ply", g, mask=torch.arange(10))
    assert not (tmp_path / "bad.ply").exists()


def test_zero_gaussians(tmp_path):
    g = random_gaussians(0, 3, 2)
    p = tmp_path / "empty.ply"
    save_ply(p, g)
    h = load_ply(p)
    assert len(h) == 0 and h.shN.shape == (0, 15, 3) and h.latents.shape == (0, 2)


def test_save_refuses_non_finite_and_keeps_old_file(tmp_path):
    p = tmp_path / "s.ply"
    save_ply(p, random_gaussians(5, 0))
    before = p.read_bytes()
    g = random_gaussians(5, 0, seed=9)
    g.scales[2, 1] = float("inf")
    with pytest.raises(NonFiniteError, match="scale_1"):
        save_ply(p, g)
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.ply"]


def test_ply_field_names():
    assert ply_field_names(0) == "x y z f_dc_0 f_dc_1 f_dc_2 opacity scale_0 scale_1 scale_2 rot_0 rot_1 rot_2 rot_3".split()
    names = ply_field_names(3, 2, normals=True)
    assert names[:6] == ["x", "y", "z", "nx", "ny", "nz"]
    assert names[9:54] == [f"f_rest_{i}" for i in range(45)]
    assert names[-2:] == ["sem_0", "sem_1"]
    assert len(ply_field_names(1, 0)) == 14 + 9


# ------------------------------------------------------------------ INRIA compatibility
def write_inria_ply(path, xyz, f_dc, f_rest, opacities, scale, rotation):
    """What the original 3DGS ``GaussianModel.save_ply`` does (plyfile, hand-built dtype).

    f_dc: [N, 3, 1], f_rest: [N, 3, K] (INRIA keeps features as [N, K+1, 3] and writes
    ``features.transpose(1, 2).flatten(start_dim=1)``), i.e. channel-major.
    """
    n = xyz.shape[0]
    normals = np.zeros_like(xyz)
    f_dc_flat = f_dc.reshape(n, -1)
    f_rest_flat = f_rest.reshape(n, -1)
    attrs = ["x", "y", "z", "nx", "ny", "nz"]
    attrs += [f"f_dc_{i}" for i in range(f_dc_flat.shape[1])]
    attrs += [f"f_rest_{i}" for i in range(f_rest_flat.shape[1])]
    attrs += ["opacity"]
    attrs += [f"scale_{i}" for i in range(scale.shape[1])]
    attrs += [f"rot_{i}" for i in range(rotation.shape[1])]
    dtype_full = [(a, "f4") for a in attrs]
    elements = np.empty(n, dtype=dtype_full)
    attributes = np.concatenate((xyz, normals, f_dc_flat, f_rest_flat, opacities, scale, rotation), axis=1)
    elements[:] = list(map(tuple, attributes))
    PlyData([PlyElement.describe(elements, "vertex")]).write(str(path))
    return attrs


def test_inria_compat(tmp_path):
    n, k = 6, 15
    rng = np.random.default_rng(7)
    xyz = rng.normal(size=(n, 3)).astype(np.float32)
    f_dc = rng.normal(size=(n, 3, 1)).astype(np.float32)
    # f_rest[i, c, j] = 1000*i + 100*c + j  -> the value tells channel and coefficient
    f_rest = (1000 * np.arange(n)[:, None, None] + 100 * np.arange(3)[None, :, None] + np.arange(k)[None, None, :]).astype(np.float32)
    opac = rng.normal(size=(n, 1)).astype(np.float32)
    scale = rng.normal(size=(n, 3)).astype(np.float32)
    rot = rng.normal(size=(n, 4)).astype(np.float32)
    p = tmp_path / "point_cloud.ply"
    attrs = write_inria_ply(p, xyz, f_dc, f_rest, opac, scale, rot)

    g = load_ply(p)
    assert len(g) == n and g.sh_degree == 3
    np.testing.assert_array_equal(g.means.numpy(), xyz)
    np.testing.assert_array_equal(g.sh0.numpy(), f_dc.transpose(0, 2, 1))  # [N, 1, 3]
    np.testing.assert_array_equal(g.opacities.numpy(), opac[:, 0])
    np.testing.assert_array_equal(g.scales.numpy(), scale)
    np.testing.assert_array_equal(g.quats.numpy(), rot)
    # shN[i, j, c] is coefficient j of channel c
    assert g.shN.shape == (n, 15, 3)
    assert g.shN[2, 5, 1].item() == 2000 + 100 + 5
    assert g.shN[4, 14, 2].item() == 4000 + 200 + 14
    assert g.shN[0, 0, 0].item() == 0.0
    np.testing.assert_array_equal(g.shN.numpy(), f_rest.transpose(0, 2, 1))
    # file property f_rest_{c*K + k}
    raw = PlyData.read(str(p))["vertex"]
    assert raw["f_rest_" + str(1 * k + 5)][2] == 2105.0
    assert list(g.extra) == ["nx", "ny", "nz"]
    assert g.latents is None

    out = tmp_path / "ours.ply"
    save_ply(out, g)
    assert vertex_names(out) == attrs
    assert out.read_bytes() == p.read_bytes()  # identical bytes, header included

    g.latents = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
    save_ply(out, g)
    assert vertex_names(out) == attrs + ["sem_0", "sem_1"]
    h = load_ply(out)
    np.testing.assert_array_equal(h.latents.numpy(), np.arange(n * 2, dtype=np.float32).reshape(n, 2))
    np.testing.assert_array_equal(PlyData.read(str(out))["vertex"]["f_rest_20"], f_rest[:, 1, 5])


@pytest.mark.parametrize("latent_dtype", ["float16", "float32"])
def test_loads_ascii_and_big_endian(tmp_path, latent_dtype):
    g = random_gaussians(4, 1, 2, seed=4, half_latents=latent_dtype == "float16")
    p = tmp_path / "le.ply"
    save_ply(p, g, latent_dtype=latent_dtype)
    ply = PlyData.read(str(p))
    be = tmp_path / "be.ply"
    PlyData(ply.elements, text=False, byte_order=">", comments=ply.comments).write(str(be))
    assert_bit_exact(g, load_ply(be))  # big-endian ushort float16 bit patterns
    txt = tmp_path / "txt.ply"
    PlyData(ply.elements, text=True, comments=ply.comments).write(str(txt))
    assert_bit_exact(g, load_ply(txt))  # %.18g round-trips float32; ushort as decimal integers
    # the comment may also sit inside the vertex element
    el = PlyElement.describe(ply["vertex"].data, "vertex", comments=ply.comments)
    inside = tmp_path / "inside.ply"
    PlyData([el]).write(str(inside))
    assert_bit_exact(g, load_ply(inside))


def _rewrite(src, dst, comments, sem_type=None):
    """Copy ``src``'s vertex data to ``dst`` with other header comments (and sem_* cast to ``sem_type``)."""
    data = PlyData.read(str(src), mmap=False)["vertex"].data
    if sem_type is not None:
        dt = [(nm, sem_type if nm.startswith("sem_") else data.dtype[nm]) for nm in data.dtype.names]
        new = np.empty(len(data), dtype=dt)
        for nm in data.dtype.names:
            new[nm] = data[nm]
        data = new
    PlyData([PlyElement.describe(data, "vertex")], comments=comments).write(str(dst))
    return dst


def test_float16_comment_required_and_consistent(tmp_path):
    p = save_ply(tmp_path / "h.ply", random_gaussians(6, 0, 3, seed=2), latent_dtype="float16")
    # ushort sem_* without the comment (a tool dropped it): refused, not read as integers
    bad = _rewrite(p, tmp_path / "nocomment.ply", ["made by some tool"])
    with pytest.raises(PlyFormatError, match="not the header line 'comment rh3dgs sem_dtype float32'") as ei:
        load_ply(bad)
    assert str(bad) in str(ei.value) and ei.value.field == "sem_0"
    # the comment with sem_* of another type: refused
    bad = _rewrite(p, tmp_path / "asfloat.ply", ["rh3dgs sem_dtype float16"], sem_type="f4")
    with pytest.raises(PlyFormatError, match="stored as float") as ei:
        load_ply(bad)
    assert ei.value.field == "sem_0"
    # a malformed or conflicting comment: refused, naming the header comment
    for comments in (["rh3dgs sem_dtype bfloat16"], ["rh3dgs sem_dtype"], ["rh3dgs sem_dtype float16", "rh3dgs sem_dtype float32"]):
        bad = _rewrite(p, tmp_path / "badcomment.ply", comments)
        with pytest.raises(PlyFormatError, match="sem_dtype") as ei:
            load_ply(bad)
        assert ei.value.field == "comment"
    # other integer sem_* types and unmarked float sem_* are refused too (issue 19: no latent is ever guessed)
    for sem_type, comments in (("i2", []), ("i2", ["rh3dgs sem_dtype float16"]), ("f8", ["rh3dgs sem_dtype float32"])):
        with pytest.raises(PlyFormatError, match="re-export") as ei:
            load_ply(_rewrite(p, tmp_path / "int.ply", comments, sem_type=sem_type))
        assert ei.value.field == "sem_0"
    f32 = save_ply(tmp_path / "f32.ply", random_gaussians(6, 0, 3, seed=2), latent_dtype="float32")
    assert_bit_exact(load_ply(f32), load_ply(_rewrite(f32, tmp_path / "f32c.ply", ["rh3dgs sem_dtype float32"])))
    with pytest.raises(PlyFormatError, match="converter"):
        load_ply(_rewrite(f32, tmp_path / "f32n.ply", []))
    # latents=False reads the 3DGS fields of such a file, skipping sem_* unchecked
    g = load_ply(_rewrite(p, tmp_path / "int.ply", [], sem_type="i4"), latents=False)
    assert g.latents is None and "sem_0" not in g.extra
    assert_bit_exact(load_ply(f32, latents=False), load_ply(f32, latents=False))


def test_float16_overflow_is_refused(tmp_path):
    p = tmp_path / "o.ply"
    save_ply(p, random_gaussians(5, 0, 2), latent_dtype="float16")
    before = p.read_bytes()
    g = random_gaussians(5, 0, 3, seed=9)
    g.latents[3, 2] = 65504.0  # the largest float16: fine
    save_ply(tmp_path / "ok.ply", g, latent_dtype="float16")
    g.latents[1, 2] = -70000.0
    g.latents[4, 2] = 65505.0  # would round to 65504, but is outside the range: refused too
    with pytest.raises(PlyFormatError, match=r"2 latent value\(s\) outside the float16 range.*first at Gaussian 1.*float32") as ei:
        save_ply(p, g, latent_dtype="float16")
    assert ei.value.field == "sem_2" and str(p) in str(ei.value)
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["o.ply", "ok.ply"]
    save_ply(p, g, latent_dtype="float32")
    assert load_ply(p).latents[1, 2].item() == -70000.0


# ------------------------------------------------------------------ bad inputs
def _valid(tmp_path, n=50):
    p = tmp_path / "valid.ply"
    save_ply(p, random_gaussians(n, 2, 3))
    return p


def test_missing_file(tmp_path):
    p = tmp_path / "nope.ply"
    with pytest.raises(PlyFormatError, match="file not found") as ei:
        load_ply(p)
    assert str(p) in str(ei.value) and ei.value.path == p


def test_truncated_file(tmp_path):
    src = _valid(tmp_path)
    raw = src.read_bytes()
    for cut in (1, 100, len(raw) - raw.index(b"end_header") - 5, len(raw) - 20):
        bad = tmp_path / f"cut{cut}.ply"
        bad.write_bytes(raw[:-cut])
        with pytest.raises(PlyFormatError) as ei:
            load_ply(bad)
        msg = str(ei.value)
        assert str(bad) in msg
        assert "truncated" in msg or "corrupt" in msg
        if cut < 200:  # cut inside the vertex data
            assert "truncated" in msg and ei.value.field == "vertex"


def test_random_bytes_and_empty(tmp_path):
    bad = tmp_path / "noise.ply"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(PlyFormatError, match="not a valid PLY") as ei:
        load_ply(bad)
    assert str(bad) in str(ei.value)
    empty = tmp_path / "empty.ply"
    empty.write_bytes(b"")
    with pytest.raises(PlyFormatError, match="empty"):
        load_ply(empty)
    # a header claiming far more rows than the file holds
    lie = tmp_path / "lie.ply"
    lie.write_bytes(b"ply\nformat ascii 1.0\nelement vertex 999999999999\nproperty float x\nend_header\n1\n")
    with pytest.raises(PlyFormatError, match="truncated or corrupt"):
        load_ply(lie)


def test_mesh_ply_without_3dgs_fields(tmp_path):
    verts = np.array([(0, 0, 0), (1, 0, 0), (0, 1, 0)], dtype=[("x", "f4"), ("y", "f4"), ("z", "f4")])
    faces = np.array([([0, 1, 2],)], dtype=[("vertex_indices", "i4", (3,))])
    p = tmp_path / "mesh.ply"
    PlyData([PlyElement.describe(verts, "vertex"), PlyElement.describe(faces, "face")]).write(str(p))
    with pytest.raises(PlyFormatError) as ei:
        load_ply(p)
    msg = str(ei.value)
    assert str(p) in msg and "missing required 3DGS properties" in msg and ei.value.field == "vertex"
    for name in ("f_dc_0", "opacity", "scale_0", "rot_3"):
        assert name in msg
    assert "mesh" in msg

    only_faces = tmp_path / "faces.ply"
    PlyData([PlyElement.describe(faces, "face")]).write(str(only_faces))
    with pytest.raises(PlyFormatError, match="no 'vertex' element") as ei:
        load_ply(only_faces)
    assert ei.value.field == "vertex"


def test_bad_f_rest_count(tmp_path):
    g = random_gaussians(3, 1)
    p = tmp_path / "r.ply"
    save_ply(p, g)
    v = PlyData.read(str(p))["vertex"].data
    keep = [nm for nm in v.dtype.names if nm != "f_rest_8"]
    bad = tmp_path / "r8.ply"
    packed = np.empty(len(v), dtype=[(nm, "f4") for nm in keep])
    for nm in keep:
        packed[nm] = v[nm]
    PlyData([PlyElement.describe(packed, "vertex")]).write(str(bad))
    with pytest.raises(PlyFormatError, match="8 f_rest_. properties") as ei:
        load_ply(bad)
    assert str(bad) in str(ei.value) and ei.value.field == "f_rest"


@pytest.mark.parametrize("old,new", [("f_rest_8", "f_rest_08"), ("sem_1", "sem_01")])
def test_numbered_property_with_leading_zeros(tmp_path, old, new):
    """f_rest_08 (atheris: a KeyError looking for f_rest_8) is refused by name, not read as column 8."""
    p = tmp_path / "r.ply"
    save_ply(p, random_gaussians(3, 1, 2))
    v = PlyData.read(str(p))["vertex"].data
    names = [new if nm == old else nm for nm in v.dtype.names]
    renamed = np.empty(len(v), dtype=[(nm, "f4") for nm in names])
    for nm, src in zip(names, v.dtype.names):
        renamed[nm] = v[src]
    bad = tmp_path / "zeros.ply"
    PlyData([PlyElement.describe(renamed, "vertex")], comments=["rh3dgs sem_dtype float32"]).write(str(bad))
    with pytest.raises(PlyFormatError, match="leading zeros") as ei:
        load_ply(bad)
    assert str(bad) in str(ei.value) and ei.value.field == new


@pytest.mark.parametrize("field,value,latent_dtype", [("x", np.nan, "float16"), ("scale_2", np.inf, "float16"),
                                                      ("f_rest_7", -np.inf, "float16"), ("sem_1", np.nan, "float16"),
                                                      ("sem_0", -np.inf, "float16"), ("sem_1", np.nan, "float32")])
def test_non_finite_field(tmp_path, field, value, latent_dtype):
    p = tmp_path / "v.ply"
    save_ply(p, random_gaussians(8, 1, 2, half_latents=latent_dtype == "float16"), latent_dtype=latent_dtype)
    ply = PlyData.read(str(p), mmap=False)
    data = ply["vertex"].data
    if data[field].dtype.kind == "u":  # float16 bit pattern of NaN / Inf
        data[field][[2, 5]] = np.array([value], np.float16).view(np.uint16)
    else:
        data[field][[2, 5]] = value
    bad = tmp_path / "nan.ply"
    PlyData([PlyElement.describe(data, "vertex")], comments=ply.comments).write(str(bad))
    with pytest.raises(PlyFormatError) as ei:
        load_ply(bad)
    msg = str(ei.value)
    assert str(bad) in msg and f"[{field}]" in msg and "2 non-finite" in msg and "first at vertex 2" in msg
    assert ei.value.field == field


def test_nan_in_extra_field_is_kept(tmp_path):
    g = random_gaussians(4, 0, extra={"nx": torch.tensor([0.0, float("nan"), 1.0, 2.0])})
    p = tmp_path / "e.ply"
    save_ply(p, g)
    h = load_ply(p)
    assert torch.isnan(h.extra["nx"][1]) and h.extra["nx"][3].item() == 2.0


def test_bad_extra_names_and_shapes(tmp_path):
    with pytest.raises(PlyFormatError, match="collides"):
        save_ply(tmp_path / "a.ply", random_gaussians(2, 0, extra={"sem_0": torch.zeros(2)}))
    with pytest.raises(PlyFormatError, match="ASCII"):
        save_ply(tmp_path / "a.ply", random_gaussians(2, 0, extra={"a b": torch.zeros(2)}))
    with pytest.raises(ShapeError, match="extra"):
        save_ply(tmp_path / "a.ply", random_gaussians(2, 0, extra={"v": torch.zeros(2, 3)}))
    with pytest.raises(PlyFormatError, match="64-bit"):
        save_ply(tmp_path / "a.ply", random_gaussians(2, 0, extra={"big": torch.tensor([0, 2**40])}))
    assert not (tmp_path / "a.ply").exists()
    # representable conversions: bool -> uint8, int64 -> int32
    save_ply(tmp_path / "b.ply", random_gaussians(2, 0, extra={"flag": torch.tensor([True, False]), "i": torch.tensor([-3, 7])}))
    h = load_ply(tmp_path / "b.ply")
    assert h.extra["flag"].dtype == torch.uint8 and h.extra["flag"].tolist() == [1, 0]
    assert h.extra["i"].dtype == torch.int32 and h.extra["i"].tolist() == [-3, 7]


def test_compressed_and_rgb_hints(tmp_path):
    v = np.zeros(2, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1"),
                           ("opacity", "f4"), ("scale_0", "f4"), ("scale_1", "f4"), ("scale_2", "f4"),
                           ("rot_0", "f4"), ("rot_1", "f4"), ("rot_2", "f4"), ("rot_3", "f4")])
    p = tmp_path / "rgb.ply"
    PlyData([PlyElement.describe(v, "vertex")]).write(str(p))
    with pytest.raises(PlyFormatError, match="red/green/blue"):
        load_ply(p)


def test_lazy_package_exports(tmp_path):
    import rh3dgs

    p = tmp_path / "pkg.ply"
    rh3dgs.save_ply(p, random_gaussians(3, 0))
    assert len(rh3dgs.load_ply(p)) == 3


def test_nerfstudio_exporter_layout(tmp_path):
    """Header + data the way ``ns-export gaussian-splat`` writes them (by hand, with comments)."""
    n, k = 4, 3
    rng = np.random.default_rng(11)
    shs_rest = rng.normal(size=(n, k, 3)).astype(np.float32)  # splatfacto keeps [N, K, 3]
    cols = {"x": rng.normal(size=n), "y": rng.normal(size=n), "z": rng.normal(size=n)}
    cols.update({nm: np.zeros(n) for nm in ("nx", "ny", "nz")})
    cols.update({f"f_dc_{i}": rng.normal(size=n) for i in range(3)})
    rest = shs_rest.transpose(0, 2, 1).reshape(n, -1)  # exporter: shs_rest.transpose(1, 2).reshape(n, -1)
    cols.update({f"f_rest_{i}": rest[:, i] for i in range(3 * k)})
    cols["opacity"] = rng.normal(size=n)
    cols.update({f"scale_{i}": rng.normal(size=n) for i in range(3)})
    cols.update({f"rot_{i}": rng.normal(size=n) for i in range(4)})
    header = "ply\nformat binary_little_endian 1.0\ncomment Generated by Nerstudio 1.1.5\ncomment Vertical Axis: z\n"
    header += f"element vertex {n}\n" + "".join(f"property float {nm}\n" for nm in cols) + "end_header\n"
    body = np.stack([np.asarray(v, np.float32) for v in cols.values()], axis=1).astype("<f4").tobytes()
    p = tmp_path / "splat.ply"
    p.write_bytes(header.encode("ascii") + body)

    g = load_ply(p)
    np.testing.assert_array_equal(g.shN.numpy(), shs_rest)
    np.testing.assert_array_equal(g.quats.numpy(), np.stack([cols[f"rot_{i}"] for i in range(4)], 1).astype(np.float32))
    out = tmp_path / "out.ply"
    save_ply(out, g)
    assert vertex_names(out) == list(cols)
    assert out.read_bytes().endswith(body)  # same data; only the comments are not kept


# ------------------------------------------------------------------ saturated opacities
def test_infinite_opacity_logits_are_saturated_nan_is_an_error(tmp_path):
    g = random_gaussians(6, 1, 2, seed=8, half_latents=False)
    g.opacities[1], g.opacities[4] = float("inf"), float("-inf")  # what splat-transform writes for opaque splats
    p = save_ply(tmp_path / "inf.ply", g)
    h = load_ply(p)
    assert_bit_exact(g, h)
    assert h.activated_opacities[[1, 4]].tolist() == [1.0, 0.0]
    assert save_ply(tmp_path / "again.ply", h).read_bytes() == p.read_bytes()
    ply = PlyData.read(str(p), mmap=False)
    ply["vertex"].data["opacity"][3] = np.nan
    PlyData([ply["vertex"]], comments=ply.comments).write(str(tmp_path / "nan.ply"))
    with pytest.raises(PlyFormatError, match=r"1 NaN value\(s\).*first at vertex 3") as ei:
        load_ply(tmp_path / "nan.ply")
    assert ei.value.field == "opacity"
    g.opacities[2] = float("nan")
    with pytest.raises(NonFiniteError, match="opacity"):
        save_ply(tmp_path / "nan2.ply", g)
    g.opacities[2] = 0.0
    g.scales[0, 0] = float("inf")  # other fields: Inf is still an error
    with pytest.raises(NonFiniteError, match="scale_0"):
        save_ply(tmp_path / "inf2.ply", g)


def test_column_types_are_checked(tmp_path):
    """Standard fields must be floats; doubles beyond float32 are refused, not turned into Inf."""
    p = save_ply(tmp_path / "a.ply", random_gaussians(5, 0, seed=1))
    data = PlyData.read(str(p), mmap=False)["vertex"].data
    as_int = np.empty(len(data), dtype=[(nm, "i4" if nm == "scale_1" else data.dtype[nm]) for nm in data.dtype.names])
    for nm in data.dtype.names:
        as_int[nm] = data[nm].astype(np.int64).clip(-(2**31), 2**31 - 1) if nm == "scale_1" else data[nm]
    PlyData([PlyElement.describe(as_int, "vertex")]).write(str(tmp_path / "int.ply"))
    with pytest.raises(PlyFormatError, match="stored as int, but a 3DGS 'scale_1' is a float") as ei:
        load_ply(tmp_path / "int.ply")
    assert ei.value.field == "scale_1"
    dbl = np.empty(len(data), dtype=[(nm, "f8") for nm in data.dtype.names])
    for nm in data.dtype.names:
        dbl[nm] = data[nm]
    PlyData([PlyElement.describe(dbl, "vertex")]).write(str(tmp_path / "f8.ply"))
    assert_bit_exact(load_ply(p), load_ply(tmp_path / "f8.ply"))
    dbl["y"][2] = 1e300
    PlyData([PlyElement.describe(dbl, "vertex")]).write(str(tmp_path / "big.ply"))
    with pytest.raises(PlyFormatError, match="beyond the float32 range.*first at vertex 2") as ei:
        load_ply(tmp_path / "big.ply")
    assert ei.value.field == "y"


def test_header_row_count_goes_through_the_memory_model(tmp_path):
    from rh3dgs.errors import MemoryLimitError
    from rh3dgs.memory import memory_limit

    names = ply_field_names(0, 2)
    hdr = "ply\nformat binary_little_endian 1.0\nelement vertex 1000000000000\n"
    hdr += "".join(f"property float {nm}\n" for nm in names) + "end_header\n"
    p = tmp_path / "huge.ply"
    p.write_bytes(hdr.encode() + bytes(64 * 4))
    with pytest.raises(PlyFormatError, match=r"1000000000000 'vertex' rows.*truncated or corrupt.*memory estimate "
                                             r"\d+ TiB") as ei:
        load_ply(p)
    assert str(p) in str(ei.value)
    # a real file whose rows fit the file but not the budget: the estimate and the budget in the message
    small = save_ply(tmp_path / "ok.ply", random_gaussians(2000, 3, 4, seed=2, half_latents=False))
    with memory_limit("256K"), pytest.raises(MemoryLimitError, match=r"loading 2000 Gaussians: memory estimate "
                                                                     r"[\d.]+ KiB .* exceeds the limit set by "
                                                                     r"--max-memory \(256 KiB\)"):
        load_ply(small)
    with memory_limit("256K"):
        assert len(load_ply(save_ply(tmp_path / "few.ply", random_gaussians(20, 3, 4, seed=2)))) == 20


# ------------------------------------------------------------------ other tools: splat-transform, gsply
BROWSER = __import__("pathlib").Path(__file__).resolve().parent / "browser"
SPLAT_TRANSFORM = BROWSER / "node_modules" / ".bin" / "splat-transform"


def splat_transform(*args, timeout=120):
    """Run the pinned @playcanvas/splat-transform (tests/browser/package-lock.json); without it the test fails
    (``make test`` installs it: scripts/setup_system.sh test), as the browser tests do, never skips."""
    import shutil
    import subprocess

    if shutil.which("node") is None or not SPLAT_TRANSFORM.exists():
        pytest.fail("@playcanvas/splat-transform is not installed: run `make test` (or scripts/setup_system.sh "
                    "test, which runs npm ci --prefix tests/browser)")
    r = subprocess.run([str(SPLAT_TRANSFORM), "-q", "-w", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]


def plain_scene(n=300, seed=0, latents=4):
    """A plausible splat (values as trained scenes have them) with normals and an integer label."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return Gaussians(means=r(n, 3) * 2, scales=r(n, 3) * 0.5 - 3, quats=r(n, 4), opacities=r(n) * 2,
                     sh0=r(n, 1, 3), shN=r(n, 15, 3) * 0.1, latents=r(n, latents) * 0.3 if latents else None,
                     extra={"nx": torch.zeros(n), "ny": torch.zeros(n), "nz": torch.zeros(n),
                            "class_id": torch.randint(0, 9, (n,), generator=gen).to(torch.uint8)})


def assert_same_3dgs_fields(g, h):
    for name in ("means", "scales", "quats", "opacities", "sh0", "shN"):
        assert same_bits(getattr(g, name), getattr(h, name)), name


@pytest.mark.parametrize("latent_dtype", ["float32", "float16"])
def test_splat_transform_round_trip_is_refused_not_misread(tmp_path, latent_dtype):
    """Issue 19: a semantic PLY through splat-transform loses the marker (and float16 ushort columns become
    uint); loading it must fail naming the file, the column, the cause and the way back - never return
    reinterpreted latents - while its plain 3DGS fields still load exactly."""
    import rh3dgs
    from rh3dgs.api import save_scene
    from rh3dgs.field import SemanticField

    g = plain_scene()
    src = save_ply(tmp_path / "semantic.ply", g, latent_dtype=latent_dtype)
    out = tmp_path / "converted.ply"
    splat_transform(src, out)
    header = header_of(out)
    assert "sem_0" in header and "rh3dgs sem_dtype" not in header  # the converter kept the columns, not the marker
    with pytest.raises(PlyFormatError) as ei:
        load_ply(out)
    msg = str(ei.value)
    assert str(out) in msg and ei.value.field == "sem_0"
    assert "converter" in msg and "re-export" in msg and "scene folder" in msg
    h = load_ply(out, latents=False)
    assert h.latents is None and len(h) == len(g)
    assert_same_3dgs_fields(g, h)
    # a scene folder whose semantic.ply went through the converter: refused before any query runs, by the
    # scene's file record (its size and sha256 in rh3dgs.json) and, in a scene without records, by the column
    field = SemanticField(g.latents, torch.nn.functional.normalize(torch.randn(8, 4), dim=0))
    scene_dir = save_scene(tmp_path / "scene", g, field, latent_dtype=latent_dtype)
    (scene_dir / "semantic.ply").write_bytes(out.read_bytes())
    with pytest.raises(InputFileError, match="semantic.ply: changed since rh3dgs wrote the scene"):
        rh3dgs.load(scene_dir)
    meta = json.loads((scene_dir / "rh3dgs.json").read_text())
    del meta["files"]  # as an rh3dgs from before the records wrote it
    (scene_dir / "rh3dgs.json").write_text(json.dumps(meta))
    with pytest.raises(PlyFormatError, match="sem_0"):
        rh3dgs.load(scene_dir)


def test_export_reads_the_same_in_gsply_splat_transform_and_plyfile(tmp_path):
    """Issue 19: the default export (select / export) is a plain INRIA PLY: gsply and splat-transform read
    the same positions, scales, opacities and colours as plyfile."""
    gsply = pytest.importorskip("gsply")
    from rh3dgs.api import Scene
    from rh3dgs.field import SemanticField

    g = plain_scene(n=257)
    scene = Scene(g, SemanticField(g.latents, torch.nn.functional.normalize(torch.randn(8, 4), dim=0)))
    p = scene.export_ply(tmp_path / "export.ply", mask=torch.arange(257) % 3 != 0, extra=True)
    ref = PlyData.read(str(p))["vertex"].data
    col = lambda *names: np.stack([np.asarray(ref[nm], np.float32) for nm in names], -1)  # noqa: E731
    expect = {"means": col("x", "y", "z"), "scales": col("scale_0", "scale_1", "scale_2"),
              "opacities": col("opacity")[:, 0], "sh0": col("f_dc_0", "f_dc_1", "f_dc_2"),
              "quats": col("rot_0", "rot_1", "rot_2", "rot_3"),
              "shN": col(*[f"f_rest_{i}" for i in range(45)]).reshape(-1, 3, 15).transpose(0, 2, 1)}
    assert len(ref) == 171 and "sem_0" not in ref.dtype.names
    gs = gsply.plyread(str(p))
    for name, want in expect.items():
        np.testing.assert_array_equal(np.asarray(getattr(gs, name), np.float32), want, err_msg=f"gsply {name}")
    csv = tmp_path / "export.csv"
    splat_transform(p, csv)
    lines = csv.read_text().splitlines()
    cols = lines[0].split(",")
    vals = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]]).astype(np.float32)
    st = {c: vals[:, j] for j, c in enumerate(cols)}
    for names in (("x", "y", "z"), ("scale_0", "scale_1", "scale_2"), ("opacity",), ("f_dc_0", "f_dc_1", "f_dc_2"),
                  tuple(f"f_rest_{i}" for i in range(45))):
        np.testing.assert_array_equal(np.stack([st[c] for c in names], -1), col(*names), err_msg=str(names[:3]))
    # and rh3dgs reads it back: same fields, the label kept as a float column (extra=True)
    h = load_ply(p)
    assert_same_3dgs_fields(g[torch.arange(257) % 3 != 0], h)
    assert h.extra["class_id"].dtype == torch.float32


def test_old_float16_files_still_load(tmp_path):
    """Backward compatibility: files of earlier versions (float16 bit patterns in ushort + marker)."""
    g = plain_scene(n=40)
    p = save_ply(tmp_path / "old.ply", g, latent_dtype="float16")
    raw = p.read_bytes()
    assert b"comment rh3dgs sem_dtype float16" in raw[:4000] and b"property ushort sem_0" in raw[:4000]
    h = load_ply(p)
    assert_same_3dgs_fields(g, h)
    assert torch.equal(h.latents, g.latents.half().float())


REALDATA_SPLATS = __import__("pathlib").Path("/work/shared/realdata/splats")


@pytest.mark.slow
@pytest.mark.parametrize("name,n,n_inf", [("donut.ply", 45624, None), ("biker.compressed.ply", 152746, 198),
                                          ("guitar.compressed.ply", 90854, 667)])
def test_real_splats_load(tmp_path, name, n, n_inf):
    src = REALDATA_SPLATS / name
    if not src.is_file():
        pytest.skip(f"real data not present ({src}); see shared/realdata/README.md")
    if name.endswith(".compressed.ply"):  # read as it is (gsply: tests/test_io_compressed.py), and as splat-transform
        direct = load_ply(src)            # decompresses it to the INRIA layout, with +inf for fully opaque splats
        assert len(direct) == n
        out = tmp_path / name.replace(".compressed", "")
        splat_transform(src, out)
        src = out
    g = load_ply(src)
    assert len(g) == n and g.latents is None
    if n_inf is not None:
        assert int(torch.isinf(g.opacities).sum()) == n_inf and (g.opacities[torch.isinf(g.opacities)] > 0).all()
    finite = torch.isfinite(torch.cat([g.means, g.scales, g.quats, g.sh0.flatten(1), g.shN.flatten(1)], 1))
    assert finite.all()
    if name.endswith(".compressed.ply"):
        torch.testing.assert_close(g.means, direct.means, rtol=0, atol=1e-4)
        torch.testing.assert_close(g.sh0, direct.sh0, rtol=0, atol=1e-4)


def test_default_export_has_exactly_the_inria_properties(tmp_path):
    """`rh3dgs export` / `select` / Scene.export_ply by default: exactly INRIA 3DGS's properties, in its order, all
    float (normals 0 when the scene has none); class_id and the latents only on request."""
    from rh3dgs.api import Scene
    from rh3dgs.cli import main
    from rh3dgs.field import SemanticField
    from rh3dgs.io.scene import save_scene

    g = plain_scene(n=50)
    g.extra.pop("nx"), g.extra.pop("ny"), g.extra.pop("nz")
    scene_dir = save_scene(tmp_path / "scene", g, SemanticField(g.latents, torch.nn.functional.normalize(
        torch.randn(8, 4), dim=0)))
    assert main(["export", str(scene_dir), "--output", str(tmp_path / "plain.ply")]) == 0
    v = PlyData.read(str(tmp_path / "plain.ply"))["vertex"]
    assert [p.name for p in v.properties] == ply_field_names(3, normals=True)
    assert all(p.val_dtype in ("f4", "float32", "float") for p in v.properties), [p.val_dtype for p in v.properties]
    assert not np.asarray(v.data["nx"]).any()
    h = load_ply(tmp_path / "plain.ply")
    assert_same_3dgs_fields(g, h)
    with_extra = Scene(g).export_ply(tmp_path / "extra.ply", extra=True)
    assert "class_id" in PlyData.read(str(with_extra))["vertex"].data.dtype.names
