"""rh3dgs.io.outputs: the one output check of every command (and rh3dgs.io.atomic's refusal of special files).

* Outputs only ever replace regular files (or folders): devices, FIFOs, sockets and symlinks to them are
  refused with one line, with or without ``--overwrite``, and stay what they were (issue #22).
* Inputs are never outputs: an output that is, contains or lies inside one of the command's inputs (through
  symlinks too) is refused before any work, with or without ``--overwrite``; the input trees hash the same
  before and after (issue #19).
"""
from __future__ import annotations

import hashlib
import os
import socket
import stat
import tempfile
from pathlib import Path

import pytest
import torch

import rh3dgs
from rh3dgs import Gaussians
from rh3dgs.cli import main
from rh3dgs.errors import ConfigError
from rh3dgs.io.atomic import atomic_save_bytes, check_replaceable
from rh3dgs.io.ply import load_ply
from rh3dgs.io.outputs import check_not_input, check_output_dir, check_output_file, prepare_output_dir, scene_inputs

NEVER = "never writes over what it reads"


def tree_hash(*roots: Path) -> dict:
    """{path: (kind, content sha256 or link target, inode)} of every entry under ``roots`` (links not followed)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    out[str(p)] = ("link", os.readlink(p), st.st_ino)
                elif stat.S_ISREG(st.st_mode):
                    out[str(p)] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_ino)
                else:
                    out[str(p)] = (stat.S_IFMT(st.st_mode), "", st.st_ino)
    return out


# ----------------------------------------------------------------------------- special files
@pytest.fixture
def specials():
    """A FIFO, a unix socket, a character device (a private /dev/null twin when root) and symlinks to them,
    in a short /tmp folder (unix socket paths are limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="rh3dgs-sp-", dir="/tmp"))
    os.mkfifo(d / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    nodes = {"fifo": (d / "fifo", "FIFO"), "sock": (d / "sock", "socket")}
    if os.geteuid() == 0:
        os.mknod(d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        nodes["chr"] = (d / "null", "character device")
    else:  # pragma: no cover - the suite runs as root here
        nodes["chr"] = (Path("/dev/null"), "character device")
    for key in list(nodes):
        path, kind = nodes[key]
        os.symlink(path, d / f"link_{key}")
        nodes[f"link_{key}"] = (d / f"link_{key}", kind)
    yield nodes
    sock.close()
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def _kind(path: Path):
    st = os.stat(path)
    return stat.S_IFMT(st.st_mode), st.st_rdev


@pytest.mark.parametrize("key", ["fifo", "sock", "chr", "link_fifo", "link_sock", "link_chr"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_special_files_are_refused_with_or_without_overwrite(specials, key, overwrite):
    path, kind = specials[key]
    before = _kind(path)
    for check in (check_output_file, check_output_dir, prepare_output_dir):
        with pytest.raises(ConfigError, match=kind) as e:
            check(path, overwrite)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and "only ever replaces regular files" in msg
        if key.startswith("link_"):
            assert "symbolic link to" in msg
    with pytest.raises(ConfigError, match=kind):
        atomic_save_bytes(path, b"data")  # the writer refuses too, not only the CLI's check
    assert _kind(path) == before and os.path.islink(path) == key.startswith("link_")
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_regular_files_links_to_them_and_dangling_links_are_replaceable(tmp_path):
    (tmp_path / "f").write_bytes(b"old")
    os.symlink(tmp_path / "f", tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for p in ("f", "link", "dangling", "new"):
        check_replaceable(tmp_path / p)
        assert check_output_file(tmp_path / p, overwrite=True) == tmp_path / p
    atomic_save_bytes(tmp_path / "link", b"new")  # the link is replaced, the file it named is left alone
    assert (tmp_path / "f").read_bytes() == b"old" and not os.path.islink(tmp_path / "link")


def _plain_ply(tmp_path) -> Path:
    n = 64
    g = Gaussians.from_activated(torch.rand(n, 3), 0.04 * torch.ones(n, 3), torch.randn(n, 4), 0.5 * torch.ones(n),
                                 torch.rand(n, 3))
    return rh3dgs.save_ply(tmp_path / "plain.ply", g)


@pytest.mark.parametrize("key", ["fifo", "sock", "chr", "link_chr"])
def test_cli_export_onto_a_special_file_is_refused(tmp_path, specials, key, capsys):
    path, kind = specials[key]
    before = _kind(path)
    ply = _plain_ply(tmp_path)
    for extra in ([], ["--overwrite"]):
        assert main(["export", str(ply), "--output", str(path), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and kind in err[0] and str(path) in err[0], err
    assert _kind(path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="only root could replace /dev/null")
def test_cli_export_to_dev_null_with_overwrite_leaves_the_device(tmp_path, specials, capsys):
    """The acceptance case of #22, on the real /dev/null. A private twin of it is tried first, so a regression
    fails here without ever touching the machine's /dev/null."""
    ply = _plain_ply(tmp_path)
    twin, _ = specials["chr"]
    assert main(["export", str(ply), "--output", str(twin), "--overwrite"]) == 2
    assert stat.S_ISCHR(os.stat(twin).st_mode), "the private device node was replaced: not trying /dev/null"
    capsys.readouterr()
    before = os.stat("/dev/null")
    assert main(["export", str(ply), "--output", "/dev/null", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "/dev/null is a character device" in err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_rdev, after.st_ino) == (before.st_rdev, before.st_ino)
    assert not list(Path("/dev").glob(".null.*.tmp"))
    with open("/dev/null", "wb") as f:  # still the null device: swallows writes, reads empty
        f.write(b"x" * 1000)
    assert Path("/dev/null").read_bytes() == b""


# ----------------------------------------------------------------------------- inputs are never outputs
def test_check_not_input_relations(tmp_path):
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "transforms.json").write_text("{}")
    os.symlink(data, tmp_path / "data_link")
    os.symlink(data / "transforms.json", tmp_path / "t_link.json")
    os.link(data / "transforms.json", tmp_path / "hard.json")
    inputs = [data / "transforms.json", data / "images"]
    cases = [(data / "transforms.json", "is"), (tmp_path / "t_link.json", "is"), (tmp_path / "hard.json", "is"),
             (data, "contains"), (tmp_path, "contains"), (tmp_path / "data_link", "contains"),
             (data / "images" / "x.png", "lies inside"), (tmp_path / "data_link" / "images" / "new", "lies inside")]
    for out, how in cases:
        for check in (check_output_file, check_output_dir):
            with pytest.raises(ConfigError, match=f" {how} the input ") as e:
                check(out, True, inputs)
            assert NEVER in str(e.value) and "\n" not in str(e.value)
    for ok in (data / "lifted", tmp_path / "elsewhere", data / "transforms.json.bak"):
        check_not_input(ok, inputs)
    check_not_input(tmp_path / "x", [None])


def test_scene_inputs_lists_what_loading_reads(tmp_path):
    scene = tmp_path / "scene"
    scene.mkdir()
    for n in ("rh3dgs.json", "semantic.ply", "field.npz", "transforms.json"):
        (scene / n).write_text("x")
    names = lambda ps: sorted({p.name for p in ps})  # noqa: E731
    assert names(scene_inputs(scene)) == ["field.npz", "rh3dgs.json", "semantic.ply", "transforms.json"]
    assert names(scene_inputs(scene / "rh3dgs.json")) == names(scene_inputs(scene))
    assert names(scene_inputs(scene / "semantic.ply")) == ["semantic.ply", "transforms.json"]
    assert scene_inputs(tmp_path / "missing") == [tmp_path / "missing"]


@pytest.fixture(scope="module")
def lifted(tmp_path_factory):
    """A synthetic dataset (with simulated teacher features) and the scene folder lifted from it."""
    from rh3dgs.data.teacher_sim import simulate_teacher

    root = tmp_path_factory.mktemp("outputs")
    data, scene = root / "data", root / "scene"
    assert main(["synth", "--output", str(data), "--views", "6", "--size", "32", "--seed", "3"]) == 0
    simulate_teacher(data, progress=False)
    assert main(["lift", str(data / "scene.ply"), "--data", str(data), "--output", str(scene)]) == 0
    os.symlink(scene / "semantic.ply", root / "sel_link.ply")
    os.symlink(data, root / "data_link")
    return root


def _refusals(root: Path):
    """(case, argv, how): every command given an output that is / contains / lies inside its inputs."""
    data, scene = root / "data", root / "scene"
    ply = str(data / "scene.ply")
    return [
        ("select over the scene's own PLY", ["select", str(scene), "red ball", "--output", str(scene / "semantic.ply")],
         "is"),
        ("lift into its dataset folder", ["lift", ply, "--data", str(data), "--output", str(data)], "contains"),
        ("output = input file", ["export", ply, "--output", ply], "is"),
        ("output folder = input folder", ["query", str(scene), "red ball", "--output", str(scene)], "contains"),
        ("output via a symlink to an input file", ["select", str(scene), "red ball", "--output",
                                                   str(root / "sel_link.ply")], "is"),
        ("output folder via a symlink to the input folder", ["lift", ply, "--data", str(data), "--output",
                                                             str(root / "data_link")], "contains"),
        ("lift into the features folder", ["lift", ply, "--data", str(data), "--output", str(data / "features")], "is"),
        ("render into the dataset", ["render", ply, "--transforms", str(data), "--output", str(data)], "contains"),
        ("export over the scene's field", ["export", str(scene), "--output", str(scene / "field.npz")], "is"),
        ("eval into the scene", ["eval", str(scene), "--data", str(data), "--output", str(scene)], "contains"),
        ("view exports into the scene", ["view", str(scene), "--output", str(scene / "semantic.ply")], "is"),
        ("extract's cache = the images folder", ["extract", "--data", str(data), "--teacher", "tiny-clip", "--cache",
                                                 str(data / "images")], "contains"),
    ]


CASES = ["select over the scene's own PLY", "lift into its dataset folder", "output = input file",
         "output folder = input folder", "output via a symlink to an input file",
         "output folder via a symlink to the input folder", "lift into the features folder", "render into the dataset",
         "export over the scene's field", "eval into the scene", "view exports into the scene",
         "extract's cache = the images folder"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("overwrite", [True, False])
def test_inputs_are_never_outputs(lifted, case, overwrite, capsys, monkeypatch):
    _, argv, how = next(c for c in _refusals(lifted) if c[0] == case)
    if overwrite and argv[0] not in ("view", "extract"):
        argv = argv + ["--overwrite"]

    def no_work(*a, **k):
        raise AssertionError(f"{case}: work started before the output check")

    import rh3dgs.api
    import rh3dgs.eval.suite
    import rh3dgs.io.ply
    import rh3dgs.lifting
    import rh3dgs.teachers

    for mod, name in [(rh3dgs.api, "load"), (rh3dgs.io.ply, "load_ply"), (rh3dgs.lifting, "lift"),
                      (rh3dgs.eval.suite, "evaluate_scene"), (rh3dgs.teachers, "extract_features")]:
        monkeypatch.setattr(mod, name, no_work)
    before = tree_hash(lifted / "data", lifted / "scene")
    assert main(argv) == 2, case
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NEVER in err[0] and f" {how} the input " in err[0], (case, err)
    assert tree_hash(lifted / "data", lifted / "scene") == before, case


def test_a_new_name_next_to_the_inputs_is_fine(lifted, tmp_path, capsys):
    """The check is precise: a new file inside the scene folder replaces nothing and is written."""
    scene = lifted / "scene"
    before = tree_hash(lifted / "data", scene)
    out = scene / "red_ball_selection.ply"
    try:
        assert main(["select", str(scene), "red ball", "--threshold", "0.0", "--output", str(out)]) == 0
        assert out.is_file() and len(load_ply(out)) > 0
        after = tree_hash(lifted / "data", scene)
        assert {k: v for k, v in after.items() if k != str(out)} == before
    finally:
        out.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- two inputs, one output name
def test_distinct_names_and_a_render_of_two_images_of_one_name(tmp_path, capsys):
    """Equal names (or equal but for case) get -<position>; a render of images/a/x.png and images/b/x.png writes
    both views and says so (before: the second overwrote the first)."""
    import json
    import shutil

    from fuzz.targets import seed_dir
    from rh3dgs.io.outputs import distinct_names

    assert distinct_names(["a", "b"]) == (["a", "b"], None)
    names, note = distinct_names(["x", "X", "x", "x-2"], "views")
    assert names == ["x", "X-1", "x-2_", "x-2"] and len({n.casefold() for n in names}) == 4 and "views" in note
    data = tmp_path / "data"
    shutil.copytree(seed_dir() / "data", data)
    for sub in ("a", "b"):
        (data / sub).mkdir()
        shutil.copy(data / "img0.png", data / sub / "img0.png")
    tj = json.loads((data / "transforms.json").read_text())
    tj["frames"] = [{**tj["frames"][0], "file_path": f"{sub}/img0.png"} for sub in ("a", "b")]
    (data / "transforms.json").write_text(json.dumps(tj))
    assert main(["render", str(seed_dir() / "scene.ply"), "--transforms", str(data), "--output",
                 str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "rh3dgs: warning: views named like an earlier one (img0) are written as img0-1" in err
    assert sorted(p.name for p in (tmp_path / "r").glob("*_rgb.png")) == ["img0-1_rgb.png", "img0_rgb.png"]
