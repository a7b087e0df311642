"""Teachers: tiny open_clip dense path, precomputed features, on-disk cache, registry, errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rh3dgs.errors import ConfigError, FeatureFormatError, MissingWeightsError
from rh3dgs.teachers import (
    PrecomputedTeacher,
    Teacher,
    TeacherConfig,
    extract_features,
    load_cached,
    make_teacher,
    upsample_features,
)
from rh3dgs.teachers.tiny import TINY_MODEL_NAME, create_tiny_model

OPENAI_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
OPENAI_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def tiny():
    return make_teacher("tiny-clip", seed=0, device="cpu")


def _images(b=2, h=64, w=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, h, w, generator=g)


# ----------------------------------------------------------------------------- tiny / dense
def test_tiny_dense_shape_unit_deterministic(tiny):
    x = _images()
    f = tiny.encode_images(x)
    assert f.shape == (2, 8, 8, 32) and f.dtype == torch.float32
    assert torch.allclose(f.norm(dim=-1), torch.ones(2, 8, 8), atol=1e-5)
    other = make_teacher("tiny-clip", seed=0, device="cpu")  # fresh model, same seed
    assert torch.equal(other.encode_images(x), f)
    assert torch.equal(tiny.encode_images(x), f)
    assert not torch.allclose(make_teacher("tiny-clip", seed=1, device="cpu").encode_images(x), f)
    # non-square input: short side -> 64, long side rounded to the patch (80*64/48 = 106.7 -> 104)
    g = tiny.encode_images(_images(1, 48, 80))
    assert g.shape == (1, 8, 13, 32)
    assert torch.allclose(g.norm(dim=-1), torch.ones(1, 8, 13), atol=1e-5)
    # custom resolution: 96 px short side on a 96x128 image -> 12 x 16 patches, no resize
    t96 = make_teacher("tiny-clip", image_size=96, device="cpu")
    assert t96.encode_images(_images(1, 96, 128)).shape == (1, 12, 16, 32)
    assert tiny.encode_images((_images(1) * 255).to(torch.uint8)).shape == (1, 8, 8, 32)


def _ln(x, mod):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + mod.eps) * mod.weight + mod.bias


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _mlp(x, blk):
    h = _gelu(x @ blk.mlp.c_fc.weight.T + blk.mlp.c_fc.bias)
    return h @ blk.mlp.c_proj.weight.T + blk.mlp.c_proj.bias


def _reference_dense(model, img01, dense_path="maskclip"):
    """Hand-written MaskCLIP dense path from the raw weights (one image at the native size)."""
    vis = model.visual
    x = (img01 - OPENAI_MEAN) / OPENAI_STD  # [1, 3, H, W]
    p = vis.conv1.kernel_size[0]
    width = vis.conv1.weight.shape[0]
    cols = F.unfold(x, kernel_size=p, stride=p)[0].T  # [L, 3*p*p], row-major over the patch grid
    tok = cols @ vis.conv1.weight.reshape(width, -1).T
    tok = torch.cat([vis.class_embedding[None], tok]) + vis.positional_embedding
    tok = _ln(tok, vis.ln_pre)
    blocks = list(vis.transformer.resblocks)
    for blk in blocks[:-1]:
        heads = blk.attn.num_heads
        dh = width // heads
        qkv = _ln(tok, blk.ln_1) @ blk.attn.in_proj_weight.T + blk.attn.in_proj_bias
        q, k, v = qkv.split(width, dim=-1)
        outs = []
        for hd in range(heads):
            s = slice(hd * dh, (hd + 1) * dh)
            a = torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(dh), dim=-1)
            outs.append(a @ v[:, s])
        att = torch.cat(outs, -1) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias
        tok = tok + att
        tok = tok + _mlp(_ln(tok, blk.ln_2), blk)
    last = blocks[-1]
    v = _ln(tok, last.ln_1) @ last.attn.in_proj_weight[2 * width:].T + last.attn.in_proj_bias[2 * width:]
    a = v @ last.attn.out_proj.weight.T + last.attn.out_proj.bias
    if dense_path == "maskclip":
        tok = tok + a
        tok = tok + _mlp(_ln(tok, last.ln_2), last)
    else:
        tok = a
    out = _ln(tok[1:], vis.ln_post) @ vis.proj
    g = x.shape[-1] // p
    return F.normalize(out, dim=-1).reshape(x.shape[-2] // p, g, -1)


@pytest.mark.parametrize("dense_path", ["maskclip", "value-only"])
def test_dense_matches_handwritten_reference(dense_path):
    teacher = make_teacher("tiny-clip", seed=3, device="cpu", dense_path=dense_path)
    with torch.no_grad():  # non-trivial biases / norms so that every weight matters
        g = torch.Generator().manual_seed(7)
        for prm in teacher.model.parameters():
            prm.add_(0.2 * torch.randn(prm.shape, generator=g))
    img = _images(1, 64, 64, seed=5)
    got = teacher.encode_images(img)[0]
    with torch.no_grad():
        ref = _reference_dense(teacher.model, img, dense_path)
    assert got.shape == ref.shape == (8, 8, 32)
    assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()


def test_global_embedding_untouched(tiny):
    img = _images(2, 64, 64, seed=9)
    fresh = create_tiny_model(0)
    with torch.no_grad():
        expected = fresh.encode_image((img - OPENAI_MEAN) / OPENAI_STD, normalize=True)
        before = tiny.model.encode_image((img - OPENAI_MEAN) / OPENAI_STD, normalize=True)
        state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
        tiny.encode_images(_images(1, 48, 80))  # dense pass with positional interpolation
        after = tiny.model.encode_image((img - OPENAI_MEAN) / OPENAI_STD, normalize=True)
    assert torch.equal(before, after) and torch.allclose(before, expected, atol=1e-6)
    assert all(torch.equal(state[k], v) for k, v in tiny.model.state_dict().items())
    assert torch.allclose(tiny.encode_global(img), expected, atol=1e-6)


def test_crop_pyramid_splats_global_crop_embeddings(tiny):
    t = make_teacher("tiny-clip", scales=(0.5,), crop_overlap=0.5, device="cpu")
    img = _images(1, 64, 64, seed=11)
    f = t.encode_images(img)[0]  # crops of 32 px, stride 16 -> 3 x 3 crops; grid 8 x 8 cells of 8 px
    assert f.shape == (8, 8, 32)
    crop = lambda y, x: tiny.encode_global(img[:, :, y:y + 32, x:x + 32])[0]  # noqa: E731
    assert torch.allclose(f[0, 0], crop(0, 0), atol=1e-5)  # cell centre (4, 4): one crop
    four = F.normalize(crop(0, 0) + crop(0, 16) + crop(16, 0) + crop(16, 16), dim=0)
    assert torch.allclose(f[3, 3], four, atol=1e-5)  # centre (28, 28): four crops
    both = make_teacher("tiny-clip", scales=(1.0, 0.5), device="cpu").encode_images(img)[0]
    dense = tiny.encode_images(img)[0]
    assert torch.allclose(both, F.normalize(dense + f, dim=-1), atol=1e-5)
    assert t.cache_key() != tiny.cache_key()


def test_text_matches_open_clip(tiny):
    import open_clip

    texts = ["a red mug", "wooden chair", "stuff"]
    got = tiny.encode_text(texts)
    assert got.shape == (3, 32)
    assert torch.allclose(got.norm(dim=-1), torch.ones(3), atol=1e-5)
    fresh = create_tiny_model(0)
    with torch.no_grad():
        ref = fresh.encode_text(open_clip.get_tokenizer(TINY_MODEL_NAME)(texts))
    assert torch.allclose(got, F.normalize(ref, dim=-1), atol=1e-6)
    assert tiny.encode_text([]).shape == (0, 32)


def test_clip_checkpoint_file_and_missing_weights(tiny, tmp_path):
    ckpt = tmp_path / "tiny.pt"
    torch.save(create_tiny_model(0).state_dict(), ckpt)
    t = make_teacher("clip", model=TINY_MODEL_NAME, checkpoint=str(ckpt), device="cpu")
    img = _images(1)
    assert torch.allclose(t.encode_images(img), tiny.encode_images(img), atol=1e-6)
    assert t.cache_key() != tiny.cache_key()

    missing = tmp_path / "nowhere" / "ViT-B-16.bin"
    with pytest.raises(MissingWeightsError, match="--checkpoint") as ei:
        make_teacher("clip", checkpoint=str(missing))
    assert str(missing) in str(ei.value) and "ViT-B-16" in str(ei.value)
    with pytest.raises(MissingWeightsError, match="no weights"):
        make_teacher("clip", pretrained=None)
    with pytest.raises(MissingWeightsError, match="not-a-tag"):
        make_teacher("clip", pretrained="not-a-tag")
    bad = tmp_path / "corrupt.bin"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(MissingWeightsError, match="corrupt.bin"):
        make_teacher("clip", model=TINY_MODEL_NAME, checkpoint=str(bad))
    with pytest.raises(ConfigError, match="unknown open_clip model"):
        make_teacher("clip", model="No-Such-ViT", checkpoint=str(ckpt))


def test_registry_and_config(tmp_path):
    with pytest.raises(ConfigError) as ei:
        make_teacher("dino-v9")
    for known in ("clip", "precomputed", "tiny-clip"):
        assert known in str(ei.value)
    with pytest.raises(ConfigError):
        make_teacher("tiny-clip", scales=())
    with pytest.raises(ConfigError):
        make_teacher("tiny-clip", dense_path="qq")
    with pytest.raises(ConfigError):
        make_teacher("tiny-clip", bogus=1)
    t = TeacherConfig(name="tiny-clip", device="cpu").setup()
    assert isinstance(t, Teacher) and t.dim == 32 and t.name == "tiny-clip"
    with pytest.raises(ConfigError):
        TeacherConfig(name="precomputed").setup()


# ----------------------------------------------------------------------------- precomputed
def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


@pytest.fixture()
def feat_dir(tmp_path):
    d = tmp_path / "features"
    d.mkdir()
    rng = np.random.default_rng(0)
    np.save(d / "frame_000.npy", rng.normal(size=(2, 2, 6)).astype(np.float32))
    np.savez(d / "frame_001.npz", anything=rng.normal(size=(3, 5, 6)).astype(np.float16))
    torch.save(torch.randn(4, 4, 6), d / "frame_002.pt")
    np.savez(d / "text_embeddings.npz", **{"red mug": rng.normal(size=6), "chair": rng.normal(size=(1, 6)),
                                           "table": rng.normal(size=6)})
    return d


def test_precomputed_upsampling_values(feat_dir):
    t = make_teacher("precomputed", features_dir=str(feat_dir))
    assert t.dim == 6
    raw = np.load(feat_dir / "frame_000.npy")
    np.save(feat_dir / "unit.npy", _unit(raw))
    got = t.features_for(feat_dir.parent / "images" / "unit.jpg", out_size=(4, 4))
    src = torch.from_numpy(_unit(raw)).permute(2, 0, 1)[None]
    ref = F.interpolate(src, size=(4, 4), mode="bilinear", align_corners=False)
    ref = F.normalize(ref[0].permute(1, 2, 0), dim=-1)
    assert got.shape == (4, 4, 6) and torch.allclose(got, ref, atol=1e-6)
    # non-unit input vectors are normalised per pixel first: the lengths carry no weight
    assert torch.allclose(t.features_for("frame_000", out_size=(4, 4)), ref, atol=1e-6)
    # a constant map stays constant (and unit) at any size
    np.save(feat_dir / "const.npy", np.tile(np.array([3.0, 0, 4, 0, 0, 0], np.float32), (3, 2, 1)))
    c = t.features_for("const", out_size=(7, 5))
    assert torch.allclose(c, torch.tensor([0.6, 0, 0.8, 0, 0, 0]).expand(7, 5, 6), atol=1e-6)
    assert torch.allclose(upsample_features(torch.ones(1, 1, 4) * 2, (3, 3)), torch.full((3, 3, 4), 0.5))
    # other containers, native resolution, unit norm
    assert t.load_feature_map("frame_001").shape == (3, 5, 6)
    assert torch.allclose(t.load_feature_map("frame_002.png").norm(dim=-1), torch.ones(4, 4), atol=1e-6)
    batch = t.encode_images(torch.zeros(2, 3, 8, 8), names=["frame_000", "frame_002"])
    assert batch.shape == (2, 2, 2, 6)
    with pytest.raises(ConfigError):
        t.encode_images(torch.zeros(1, 3, 8, 8))


def test_precomputed_text_lookup(feat_dir):
    t = PrecomputedTeacher(features_dir=feat_dir)
    q = t.encode_text(["chair", "red mug"])
    table = np.load(feat_dir / "text_embeddings.npz")
    assert torch.allclose(q[0], torch.from_numpy(_unit(table["chair"][0])).float(), atol=1e-6)
    assert torch.allclose(q.norm(dim=-1), torch.ones(2), atol=1e-6)
    with pytest.raises(FeatureFormatError, match="text_embeddings.npz") as ei:
        t.encode_text(["sofa"])
    assert "'sofa'" in str(ei.value) and "red mug" in str(ei.value)
    (feat_dir / "text_embeddings.npz").unlink()
    with pytest.raises(FeatureFormatError, match="text_embeddings.npz"):
        PrecomputedTeacher(features_dir=feat_dir).encode_text(["chair"])


def _expect_error(t, stem, *fragments):
    with pytest.raises(FeatureFormatError) as ei:
        t.load_feature_map(stem)
    for frag in fragments:
        assert frag in str(ei.value), str(ei.value)


def test_precomputed_errors(feat_dir):
    t = PrecomputedTeacher(features_dir=feat_dir)
    _expect_error(t, "missing_frame", "missing_frame.npy", "no feature map")
    np.save(feat_dir / "flat.npy", np.ones((4, 6), np.float32))
    _expect_error(t, "flat", "flat.npy", "3 dimensions", "(4, 6)")
    t.load_feature_map("frame_000")  # fixes D = 6
    np.save(feat_dir / "wide.npy", np.ones((2, 2, 7), np.float32))
    _expect_error(t, "wide", "wide.npy", "D=7", "D=6", "frame_000.npy")
    nan = np.ones((3, 4, 6), np.float32)
    nan[1, 2, 0] = np.nan
    nan[2, 3, 5] = np.inf
    np.save(feat_dir / "nan.npy", nan)
    _expect_error(t, "nan", "nan.npy", "2 non-finite", "(y=1, x=2)")
    zero = np.ones((3, 4, 6), np.float32)
    zero[0, 3] = 0
    zero[2, 1] = 0
    np.save(feat_dir / "zero.npy", zero)
    _expect_error(t, "zero", "zero.npy", "2 zero-norm", "(y=0, x=3)")
    data = (feat_dir / "frame_000.npy").read_bytes()
    (feat_dir / "trunc.npy").write_bytes(data[: len(data) - 20])
    _expect_error(t, "trunc", "trunc.npy", "corrupt")
    (feat_dir / "junk.pt").write_bytes(b"\x00garbage")
    _expect_error(t, "junk", "junk.pt", "corrupt")
    np.savez(feat_dir / "two.npz", a=np.ones((2, 2, 6)), b=np.ones((2, 2, 6)))
    _expect_error(t, "two", "two.npz", "exactly one array")
    np.save(feat_dir / "strings.npy", np.array([["a"]]))
    _expect_error(t, "strings", "strings.npy", "float")
    with pytest.raises(FeatureFormatError, match="nowhere"):
        PrecomputedTeacher(features_dir=feat_dir / "nowhere")


# ----------------------------------------------------------------------------- cache
class CountingTeacher(Teacher):
    """Delegates to another teacher and counts feature computations per image."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name = inner.name

    @property
    def dim(self):
        return self.inner.dim

    def encode_images(self, images):
        return self.inner.encode_images(images)

    def encode_text(self, texts):
        return self.inner.encode_text(texts)

    def cache_key(self):
        return self.inner.cache_key()

    def features_for_path(self, image_path):
        self.calls.append(image_path.name)
        return self.inner.features_for_path(image_path)


def _write_images(folder, n=3, size=(40, 56)):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    paths = []
    for i in range(n):
        p = folder / f"img_{i}.png"
        Image.fromarray(rng.integers(0, 255, size=(*size, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def test_cache_incremental_and_corruption(tiny, tmp_path):
    from PIL import Image

    images = _write_images(tmp_path / "images")
    cache = tmp_path / "cache"
    teacher = CountingTeacher(tiny)
    stats = {}
    out = extract_features(teacher, images, cache, progress=False, stats=stats)
    assert len(teacher.calls) == 3 and stats["computed"] == 3 and len(out) == 3
    arr = np.load(out[0])
    assert arr.dtype == np.float16 and arr.shape == (8, 11, 32)  # 40x56 -> 64x89.6 -> 64x88
    fmap = load_cached(out[0], out_size=(40, 56))
    assert fmap.shape == (40, 56, 32) and fmap.dtype == torch.float32
    assert torch.allclose(fmap.norm(dim=-1), torch.ones(40, 56), atol=1e-5)
    assert torch.allclose(load_cached(out[0]), tiny.features_for_path(images[0]), atol=2e-3)

    teacher.calls.clear()
    assert extract_features(teacher, images, cache, progress=False, stats=stats) == out
    assert teacher.calls == [] and stats["reused"] == 3

    # changing one image's bytes recomputes only that one
    Image.fromarray(np.zeros((40, 56, 3), np.uint8)).save(images[1])
    out2 = extract_features(teacher, images, cache, progress=False)
    assert teacher.calls == ["img_1.png"] and out2[0] == out[0] and out2[1] != out[1]

    # a truncated cache file is detected (checksum) and recomputed, never used
    teacher.calls.clear()
    good = out2[2].read_bytes()
    out2[2].write_bytes(good[: len(good) // 2])
    out3 = extract_features(teacher, images, cache, progress=False, stats=stats)
    assert teacher.calls == ["img_2.png"] and stats["invalid"] == 1
    assert out3[2].read_bytes() == good
    out3[2].write_bytes(good[:-4])
    with pytest.raises(FeatureFormatError, match=out3[2].name):
        load_cached(out3[2])

    # an entry whose array no longer has the manifest's shape, even with its size and sha256 re-recorded,
    # is recomputed, never reused (the header is checked against the record and the teacher's D)
    import hashlib
    import io
    import json

    out4 = extract_features(teacher, images, cache, progress=False)  # (recomputes the truncated one)
    teacher.calls.clear()
    buf = io.BytesIO()
    np.save(buf, np.ones((8, 11, 16), np.float16))  # D = 16, not the teacher's 32
    out4[0].write_bytes(buf.getvalue())
    manifest = out4[0].parent / "manifest.json"
    meta = json.loads(manifest.read_text())
    meta["entries"][out4[0].stem].update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    manifest.write_text(json.dumps(meta))
    extract_features(teacher, images, cache, progress=False, stats=stats)
    assert teacher.calls == ["img_0.png"] and stats["invalid"] == 1 and np.load(out4[0]).shape == (8, 11, 32)
    # a manifest of a newer cache format is refused, not overwritten
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(FeatureFormatError, match=r"manifest.json \[format\]: written by a newer rh3dgs"):
        extract_features(teacher, images, cache, progress=False)
    assert json.loads(manifest.read_text())["format"] == 99
    manifest.unlink()

    # a different teacher setting is a different cache
    teacher.calls.clear()
    other = CountingTeacher(make_teacher("tiny-clip", seed=2, device="cpu"))
    extract_features(other, images[:1], cache, progress=False)
    assert other.calls == ["img_0.png"]


def test_cache_precomputed_tracks_feature_file(feat_dir, tmp_path):
    from PIL import Image

    img = tmp_path / "images" / "frame_000.png"
    img.parent.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(img)
    t = CountingTeacher(PrecomputedTeacher(features_dir=feat_dir))
    t.entry_fingerprint = t.inner.entry_fingerprint
    (p,) = extract_features(t, [img], tmp_path / "cache", progress=False)
    np.save(feat_dir / "frame_000.npy", np.ones((2, 2, 6), np.float32))
    (p2,) = extract_features(t, [img], tmp_path / "cache", progress=False)
    assert p2 != p and len(t.calls) == 2
    assert torch.allclose(load_cached(p2), torch.full((2, 2, 6), 1 / math.sqrt(6)), atol=1e-3)


def test_open_clip_import_skips_wandb_and_leaves_it_importable():
    """timm (under open_clip) tries ``import wandb``: ~2.5 s of every CLIP-teacher command; import_open_clip
    keeps it out, and a later ``import wandb`` still works (fresh interpreter: nothing imported before)."""
    import subprocess
    import sys

    code = ("import sys; from rh3dgs.teachers.clip import import_open_clip; import_open_clip(); "
            "print('wandb' in sys.modules); import importlib.util; "
            "ok = importlib.util.find_spec('wandb') is None or __import__('wandb') is not None; print(ok)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"], out


def test_tiny_clip_warns_once_that_its_answers_are_random(monkeypatch):
    """Building tiny-clip warns, once per process, that its answers are random and names the teachers that are not."""
    import warnings

    from rh3dgs.teachers import make_teacher
    from rh3dgs.teachers import tiny as tiny_module

    monkeypatch.setattr(tiny_module, "_WARNED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_teacher("tiny-clip", device="cpu")
        make_teacher("tiny-clip", device="cpu", seed=1)
    random = [w for w in caught if issubclass(w.category, tiny_module.RandomTeacherWarning)]
    assert len(random) == 1 and "random" in str(random[0].message) and "--teacher clip" in str(random[0].message)


def test_lift_defaults_to_the_teacher_of_the_datas_cache(tmp_path, capsys):
    """`rh3dgs lift` without --teacher uses the teacher whose maps the data's cache holds (recorded in its manifest
    by extract), not `precomputed`; without a cache, precomputed."""
    from rh3dgs.cli import _teacher_config, parse
    from rh3dgs.teachers import TeacherConfig, dataset_maps

    data = tmp_path / "data"
    data.mkdir()
    cmd = parse(["lift", "s.ply", "--data", str(data), "--output", "o"]).command
    assert cmd.teacher.name == "auto" and _teacher_config(cmd.teacher, data).name == "precomputed"
    img = tmp_path / "a.png"
    from rh3dgs.io.atomic import atomic_save_png

    atomic_save_png(img, torch.rand(16, 16, 3))
    teacher = TeacherConfig(name="tiny-clip", seed=3, device="cpu").setup(data)
    dataset_maps(teacher, [img], data_dir=data, progress=False)
    capsys.readouterr()
    cfg = _teacher_config(cmd.teacher, data)
    assert cfg.name == "tiny-clip" and cfg.seed == 3 and cfg.setup(data).cache_key() == teacher.cache_key()
    assert "teacher: tiny-clip, the teacher of" in capsys.readouterr().out
