"""The nerfstudio run reader (rh3dgs.io.nerfstudio_run): config.yml is read without running code.

nerfstudio itself reads config.yml with ``yaml.Loader``, which calls whatever a file names. Each
payload below would run code (create a marker file) under that loader; ours refuses it before
anything is imported, with one line naming the file. A config written the way ``ns-train``
writes it (``yaml.dump`` of the TrainerConfig) reads back equal to what ``yaml.Loader`` builds.
The slow tests of test_nerfstudio.py read a config.yml of a real ``ns-train rh3dgs-lite`` run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

import rh3dgs
from rh3dgs.cli import main
from rh3dgs.io.nerfstudio_run import NerfstudioRunError, load_run_config


def _payloads(marker: Path) -> dict:
    touch = f'["touch", "{marker}"]'
    return {
        "os.system": f'!!python/object/apply:os.system ["touch {marker}"]\n',
        "object/new": f"!!python/object/new:subprocess.Popen [{touch}]\n",
        "subprocess inside a nerfstudio config": (
            "!!python/object:nerfstudio.configs.base_config.MachineConfig\n"
            f"seed: !!python/object/apply:subprocess.check_call [{touch}]\n"),
        "module import (name)": "x: !!python/name:rh3dgs_evil_mod.thing ''\n",
        "module import (module)": "x: !!python/module:rh3dgs_evil_mod\n",
        "module import (object)": "x: !!python/object:rh3dgs_evil_mod.Thing {}\n",
        "a function as a class": "_target: !!python/name:os.system ''\n",
        "an rh3dgs function": "_target: !!python/name:rh3dgs.cli.main ''\n",
    }


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module on sys.path whose import creates a marker file (what a module-import payload runs)."""
    marker = tmp_path / "MARKER"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "rh3dgs_evil_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\nthing = 1\n"
                                                          "class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield marker
    sys.modules.pop("rh3dgs_evil_mod", None)


@pytest.mark.parametrize("case", list(_payloads(Path("m"))))
def test_config_payloads_run_nothing_and_name_the_file(case, tmp_path, evil_module, capsys):
    run = tmp_path / "run"
    run.mkdir()
    cfg = run / "config.yml"
    cfg.write_text(_payloads(evil_module)[case])
    with pytest.raises(NerfstudioRunError) as ei:
        load_run_config(cfg)
    msg = str(ei.value)
    assert msg.startswith(f"{cfg}: line ") and "\n" not in msg and "!!python/" in msg, msg
    with pytest.raises(NerfstudioRunError):
        rh3dgs.load(cfg)
    # the CLI's readers of a .yml: one line, exit 2
    for argv in (["export", str(cfg), "--output", str(tmp_path / "o.ply")],
                 ["select", str(cfg), "chair", "--output", str(tmp_path / "s.ply")],
                 ["query", str(cfg), "chair", "--output", str(tmp_path / "q")],
                 ["eval", str(cfg), "--data", str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(cfg) in err[0], err
    assert not evil_module.exists()
    assert "rh3dgs_evil_mod" not in sys.modules
    # what nerfstudio's own loader would do with the same file (the payload is real)
    if case == "os.system":
        yaml.load(cfg.read_text(), Loader=yaml.Loader)
        assert evil_module.exists()


def test_config_that_is_not_a_run(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("just: a mapping\n")
    with pytest.raises(NerfstudioRunError, match="not a nerfstudio run config"):
        rh3dgs.load(cfg)
    cfg.write_text("a: [1, 2\n")
    with pytest.raises(NerfstudioRunError, match=r"config.yml: line \d+: cannot read"):
        load_run_config(cfg)
    with pytest.raises(NerfstudioRunError, match="not found"):
        load_run_config(tmp_path / "missing.yml")


def test_config_as_ns_train_writes_it_reads_back_equal(tmp_path):
    """``yaml.dump`` of the rh3dgs-lite TrainerConfig (what ns-train saves) -> the same config as yaml.Loader."""
    pytest.importorskip("nerfstudio")
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = tmp_path / "data"
    c.output_dir = tmp_path / "outputs"
    c.set_timestamp()
    text = yaml.dump(c)
    for tag in ("!!python/object:", "!!python/object/apply:pathlib.", "!!python/name:", "!!python/tuple",
                "!!python/object/apply:nerfstudio.utils.writer.EventName"):
        assert tag in text  # every kind of tag the restricted loader knows occurs
    (tmp_path / "config.yml").write_text(text)
    ours = load_run_config(tmp_path / "config.yml")
    assert ours == yaml.load(text, Loader=yaml.Loader) and yaml.dump(ours) == text
    assert type(ours) is type(c) and ours.pipeline.datamanager.data == tmp_path / "data"


def test_applied_transform_of_ns_process_data_is_undone(tmp_path):
    """ns-process-data datasets: nerfstudio saves transform @ applied_transform (COLMAP frame -> its own), while
    transforms.json's poses already include applied_transform; the map from nerfstudio's frame to the
    transforms.json frame is A (s T)^-1 (the fox run's Gaussians landed 90 degrees off before: 473 of 14,346
    visible)."""
    import json

    import torch

    from rh3dgs.io.coordinate_frames import applied_transform, nerfstudio_to_data

    A = [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]  # a cyclic axis swap, as a 3x4
    T = [[0.0, -1.0, 0.0, 0.5], [1.0, 0.0, 0.0, -0.25], [0.0, 0.0, 1.0, 2.0]]
    (tmp_path / "transforms.json").write_text(json.dumps({"applied_transform": A, "frames": []}))
    (tmp_path / "dp.json").write_text(json.dumps({"transform": T, "scale": 0.5}))
    A3, T3 = torch.tensor(A, dtype=torch.float64), torch.tensor(T, dtype=torch.float64)
    x_capture = torch.tensor([0.3, -1.2, 2.5], dtype=torch.float64)  # a COLMAP point ...
    x_data = A3[:, :3] @ x_capture + A3[:, 3]  # ... in transforms.json's frame (by hand)
    x_ns = 0.5 * (T3[:, :3] @ x_capture + T3[:, 3])  # ... and in nerfstudio's (by hand)
    m = nerfstudio_to_data(tmp_path / "dp.json", tmp_path)
    torch.testing.assert_close((m.s * (m.R.double() @ x_ns) + m.t.double()), x_data, atol=1e-6, rtol=0)
    (tmp_path / "transforms.json").write_text(json.dumps({"frames": []}))
    torch.testing.assert_close(applied_transform(tmp_path).R.double(), torch.eye(3, dtype=torch.float64))
    (tmp_path / "colmap" / "sparse" / "0").mkdir(parents=True)  # nerfstudio's legacy value for COLMAP datasets
    legacy = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(applied_transform(tmp_path).R.double(), legacy)



FIXTURES = Path(__file__).parent / "fixtures"


def _dataclasses_in(obj, seen=None):
    """Every dataclass instance reachable from ``obj`` through its fields."""
    import dataclasses

    seen = [] if seen is None else seen
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        seen.append(obj)
        for value in vars(obj).values():
            _dataclasses_in(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _dataclasses_in(value, seen)
    elif isinstance(obj, dict):
        for value in obj.values():
            _dataclasses_in(value, seen)
    return seen


def test_a_config_written_before_the_package_was_regrouped_reads_into_todays_classes():
    """``fixtures/config_6cdebc9.yml`` is what ``ns-train rh3dgs-lite`` wrote at commit 6cdebc9, before the modules
    moved into ``rh3dgs/lifting/`` and ``rh3dgs/method/``: the class paths it names (``rh3dgs.lifting.LiftConfig``,
    ``rh3dgs.vcd.VCDConfig``, ``rh3dgs.objective.ObjectiveConfig``) give today's classes, and every field it sets is a
    field of today's class (a renamed field would load as a stray attribute)."""
    import dataclasses

    from rh3dgs.lifting import LiftConfig
    from rh3dgs.method.objective import ObjectiveConfig
    from rh3dgs.method.vcd import VCDConfig

    cfg = load_run_config(FIXTURES / "config_6cdebc9.yml")
    model = cfg.pipeline.model
    assert type(model.lift) is LiftConfig and type(model.objective) is ObjectiveConfig
    assert type(model.lift.vcd) is VCDConfig and type(model.objective.vcd) is VCDConfig
    objs = _dataclasses_in(cfg)
    assert len(objs) > 10
    for obj in objs:
        fields = {f.name for f in dataclasses.fields(obj)}
        assert set(vars(obj)) <= fields, (type(obj).__name__, set(vars(obj)) - fields)
    assert model.lift == LiftConfig(**{f.name: getattr(model.lift, f.name) for f in dataclasses.fields(LiftConfig)})


def test_a_run_opens_at_its_training_resolution_without_reading_an_image(tmp_path):
    """`rh3dgs.load(config.yml)`'s cameras are those the run trained on (its downscale factor, its frames, the
    undistorted intrinsics), and loading reads no image: the undistorted / resized images are made one at a time,
    on first access to run_images(...).images[i], and once."""
    pytest.importorskip("nerfstudio")
    import json
    import warnings

    import torch

    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
    from rh3dgs.io.nerfstudio_run import run_images
    from rh3dgs.io.transforms import load_transforms
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    data = tmp_path / "data"
    write_dataset(make_scene(SceneConfig(num_views=6, image_size=32, gaussians_per_unit_area=400.0)), data,
                  progress=False)
    tf = json.loads((data / "transforms.json").read_text())
    tf.update(k1=-0.04, p1=0.001)  # a phone capture: distorted, one image missing
    (data / "transforms.json").write_text(json.dumps(tf))
    (data / tf["frames"][1]["file_path"]).unlink()
    config = rh3dgs_lite_config()
    config.pipeline.datamanager.data = data
    config.pipeline.datamanager.dataparser.downscale_factor = 2
    config.pipeline.datamanager.dataparser.skip_missing_images = True

    posed = run_images(tmp_path / "outputs" / "run" / "config.yml", config)
    cache = data / ".rh3dgs_cache" / "images"
    assert not cache.exists()  # no image read, undistorted or resized
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref, ref_images = load_transforms(data, downscale=2, skip_missing_images=True, image_cache=tmp_path / "ref",
                                          progress=False)
    assert (posed.cameras.width, posed.cameras.height) == (ref.width, ref.height) == (15, 15)
    assert posed.frames == [0, 2, 3, 4, 5] and posed.cameras.names == ref.names
    torch.testing.assert_close(posed.cameras.Ks, ref.Ks, rtol=0, atol=0)
    torch.testing.assert_close(posed.cameras.viewmats, ref.viewmats, rtol=0, atol=0)
    first = posed.images[2]
    assert sorted(cache.rglob("*.png")) == [first] and first.read_bytes() == Path(ref_images[2]).read_bytes()
    stamp = first.stat().st_mtime_ns
    assert posed.images[2] == first and first.stat().st_mtime_ns == stamp  # made once
