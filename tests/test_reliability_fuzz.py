"""Property-based fuzzing of every input parser: no input may crash with anything but an
rh3dgs error (``Rh3dgsError`` subclass naming the file), and no input may hang.

Targets and seed files live in ``tests/fuzz/targets.py`` (shared with the atheris runner
``tests/fuzz/run_atheris.py``). Three kinds of inputs per parser:

* mutated seeds: a small valid file with random byte flips / insertions / deletions /
  truncation / number splices (hypothesis-driven byte fuzzer);
* structure-aware inputs: valid syntax with hostile values (JSON documents with random
  types and extreme numbers at any key; PLY headers with random elements, types, counts;
  ``.npy`` / ``.npz`` arrays of any dtype, shape, NaN / Inf);
* raw random bytes.

Budgets are bounded (``RH3DGS_FUZZ_EXAMPLES`` per test, default 40) and derandomized, so
the fast suite is reproducible; the ``slow`` test runs a larger budget from ``RH3DGS_FUZZ_SEED``
(fixed by default; ``random`` for fresh examples). Every call
runs under a 10 s alarm (``fuzz.targets.time_limit``): a hang fails the test.
"""
from __future__ import annotations

import io
import json
import os
import sys
import zipfile

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fuzz.targets import TARGETS, run_one, seeds

N = int(os.environ.get("RH3DGS_FUZZ_EXAMPLES", "40"))
LONG_SEED = os.environ.get("RH3DGS_FUZZ_SEED", "20261202")
FAST = settings(max_examples=N, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
COUNTS: dict = {}


def _count(name: str, result: str) -> None:
    COUNTS.setdefault(name, {"ok": 0, "error": 0})[result] += 1


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    yield
    out = os.environ.get("RH3DGS_RELIABILITY_REPORT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"fuzz_counts_{os.getpid()}.json"), "w") as f:
            json.dump(COUNTS, f, indent=1, sort_keys=True)


# ----------------------------------------------------------------------------- byte fuzzer
_NUMBERS = [b"0", b"-1", b"1e308", b"-1e309", b"NaN", b"Infinity", b"4294967296", b"99999999999999999999999",
            b"1" * 5000, b"-0.0", b"1e-320"]


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """A seed file with 1-6 random edits (or raw random bytes, 1 time in 8)."""
    if draw(st.integers(0, 7)) == 0:
        return draw(st.binary(max_size=512))
    b = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.integers(0, 5))
        i = draw(st.integers(0, len(b)))
        if op == 0 and b:
            b[min(i, len(b) - 1)] = draw(st.integers(0, 255))
        elif op == 1:
            b[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == 2:
            del b[i:i + draw(st.integers(1, 64))]
        elif op == 3:
            b = b[:i]
        elif op == 4:
            b[i:i + draw(st.integers(0, 4))] = draw(st.sampled_from(_NUMBERS))
        else:  # duplicate a chunk (repeated keys / headers / zip members)
            j = draw(st.integers(0, len(b)))
            b[i:i] = b[j:j + draw(st.integers(1, 64))]
    return bytes(b)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_seed_never_crashes(name):
    seed = seeds()[name]
    assert run_one(name, seed) == "ok", f"the seed of {name} must parse"

    @FAST
    @given(mutated(seed))
    def check(data):
        _count(name, run_one(name, data))

    check()


# ----------------------------------------------------------------------------- structure-aware: JSON
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2 ** 63, max_value=2 ** 1100),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -1, 1e308, 1e-310, 3.5e38, -0.0]),
    st.text(max_size=12).filter(lambda s: s not in ("clip", "tiny-clip")),  # no model downloads/builds
)
_json_values = st.recursive(_json_scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                            max_leaves=12)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def json_edits(draw, seed: bytes) -> bytes:
    """The seed JSON with 1-3 values replaced by hostile ones (any type, extreme numbers) or keys deleted."""
    doc = json.loads(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            doc = draw(_json_values)
            break
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.integers(0, 4)) == 0 and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(_json_values)
        except (KeyError, IndexError, TypeError):
            pass
    return json.dumps(doc, allow_nan=True).encode()


@pytest.mark.parametrize("name", ["transforms", "scene_json"])
def test_hostile_json_values(name):
    seed = seeds()[name]

    @FAST
    @given(json_edits(seed))
    def check(data):
        _count(name + "+json", run_one(name, data))

    check()


# ----------------------------------------------------------------------------- structure-aware: PLY headers
_PLY_TYPES = ["char", "uchar", "short", "ushort", "int", "uint", "float", "double", "int8", "float32", "float64", "bogus"]
_PLY_NAMES = ["x", "y", "z", "nx", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
              "rot_0", "rot_1", "rot_2", "rot_3", "f_rest_0", "f_rest_8", "sem_0", "sem_1", "sem_3", "red", "x"]


@st.composite
def ply_files(draw) -> bytes:
    fmt = draw(st.sampled_from(["binary_little_endian", "binary_big_endian", "ascii", "binary_middle_endian"]))
    std = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
           "rot_0", "rot_1", "rot_2", "rot_3"]
    names = std + draw(st.lists(st.sampled_from(_PLY_NAMES), max_size=4)) if draw(st.booleans()) else \
        draw(st.lists(st.sampled_from(_PLY_NAMES), max_size=20))
    count = draw(st.one_of(st.integers(0, 4), st.sampled_from([-1, 2 ** 31, 2 ** 62, 10 ** 30])))
    lines = ["ply", f"format {fmt} 1.0"]
    if draw(st.booleans()):
        lines.append(f"element face {draw(st.integers(0, 3))}")
        lines.append("property list uchar int vertex_indices")
    lines.append(f"element vertex {count}")
    for n in names:
        if draw(st.integers(0, 9)) == 0:
            lines.append(f"property list {draw(st.sampled_from(_PLY_TYPES))} {draw(st.sampled_from(_PLY_TYPES))} {n}")
        else:
            lines.append(f"property {draw(st.sampled_from(_PLY_TYPES))} {n}")
    lines.append("end_header")
    head = ("\n".join(lines) + "\n").encode()
    if fmt == "ascii":
        rows = draw(st.lists(st.lists(st.sampled_from(["0", "1.5", "-2", "nan", "inf", "1e39", "x", "300"]),
                                      max_size=len(names) + 1), max_size=5))
        body = "\n".join(" ".join(r) for r in rows).encode()
    else:
        body = draw(st.one_of(st.binary(max_size=400),
                              st.builds(lambda k: np.random.default_rng(k).random(len(names) * 4).astype("<f4").tobytes(),
                                        st.integers(0, 100))))
    return head + body


def test_hostile_ply_headers():
    @FAST
    @given(ply_files())
    def check(data):
        _count("ply+header", run_one("ply", data))

    check()


# ----------------------------------------------------------------------------- structure-aware: arrays
_dtypes = st.one_of(hnp.floating_dtypes(), hnp.integer_dtypes(), hnp.boolean_dtypes(), hnp.complex_number_dtypes(),
                    hnp.unicode_string_dtypes(max_len=3), hnp.datetime64_dtypes())
_arrays = _dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _npz(d) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **d)
    return buf.getvalue()


def _pt(a) -> bytes:
    import torch

    buf = io.BytesIO()
    try:
        obj = torch.from_numpy(np.ascontiguousarray(a))
    except (TypeError, ValueError):  # dtype / byte order torch has no equivalent of
        obj = {"features": a.tolist()}
    torch.save(obj, buf)
    return buf.getvalue()


_names = st.sampled_from(["features", "decoder", "valid", "text_names", "text_vectors", "red mug", "x", ""])


@pytest.mark.parametrize("name,encode,strategy", [
    ("feature_npy", _npy, _arrays),
    ("feature_pt", _pt, _arrays),
    ("feature_npz", _npz, st.dictionaries(_names, _arrays, max_size=3)),
    ("text_embeddings", _npz, st.dictionaries(st.text(max_size=8), _arrays, max_size=3)),
    ("scene_field", _npz, st.dictionaries(_names, _arrays, max_size=4)),
])
def test_hostile_arrays(name, encode, strategy):
    @FAST
    @given(strategy)
    def check(value):
        _count(name + "+arrays", run_one(name, encode(value)))

    check()


@pytest.mark.parametrize("name", ["feature_npz", "text_embeddings", "scene_field"])
def test_npz_member_with_an_empty_name(name):
    """A zip member named "" (atheris found it in CI): zipfile's ``ZipInfo.is_dir()`` indexes the name's last
    character and raised IndexError; every .npz reader now refuses the archive in one line naming the file."""
    member = io.BytesIO()
    np.save(member, np.zeros(3, np.float32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo(""), member.getvalue())
    assert run_one(name, buf.getvalue()) == "error"


@pytest.mark.parametrize("name", ["feature_pt", "feature_npz", "checkpoint"])
def test_zip_record_flagged_encrypted(name):
    """A zip record whose flags say "encrypted" (atheris): zipfile raises RuntimeError on opening it; the
    torch-file and .npz readers refuse the file in one line."""
    member = io.BytesIO()
    np.save(member, np.zeros(3, np.float32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # zipfile writes no encrypted records: set the flag bit after
        z.writestr("features.npy", member.getvalue())
    data = bytearray(buf.getvalue())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local header, central directory
        data[data.index(signature) + flags_at] |= 0x1
    assert zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()[0].flag_bits & 0x1
    assert run_one(name, bytes(data)) == "error"


# ----------------------------------------------------------------------------- longer run
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_seed_long(name):
    """10x the fast budget. Seeded by ``RH3DGS_FUZZ_SEED`` (a fixed default, so a CI run is
    reproducible; ``RH3DGS_FUZZ_SEED=random`` for fresh examples in a fuzzing campaign)."""
    seed = seeds()[name]

    @settings(max_examples=10 * N, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated(seed))
    def check(data):
        _count(name + "+long", run_one(name, data))

    if LONG_SEED != "random":
        check = hypothesis.seed(int(LONG_SEED))(check)
    check()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ply", "transforms", "feature_npy", "text_embeddings", "scene_json", "scene_field",
                                  "checkpoint", "viewer_message"])
def test_atheris(name, tmp_path):
    """Coverage-guided fuzzing with atheris (if installed), bounded runs and time, in a subprocess; libFuzzer's
    seed is ``RH3DGS_FUZZ_SEED`` (fixed by default, so CI finds the same inputs every run; ``random`` explores)."""
    pytest.importorskip("atheris")
    import subprocess

    runs = int(os.environ.get("RH3DGS_ATHERIS_RUNS", "300"))
    here = os.path.dirname(__file__)
    seed = [] if LONG_SEED == "random" else [f"-seed={int(LONG_SEED)}"]
    proc = subprocess.run([sys.executable, os.path.join(here, "fuzz", "run_atheris.py"), name,
                           f"-atheris_runs={runs}", "-max_total_time=60", "-rss_limit_mb=4096", *seed],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = os.environ.get("RH3DGS_RELIABILITY_REPORT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"atheris_{name}.log"), "w") as f:
            f.write(proc.stderr[-4000:])
