"""rh3dgs.ranges: a numeric setting's range is declared once, on its config dataclass field, and checked
wherever a value enters (the command line, presets, stored runs and scenes, viewers, API arguments)."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass
from typing import Annotated, Optional, Tuple

import pytest

from rh3dgs.errors import ConfigError, InputFileError
from rh3dgs.ranges import Range, RangeError, check_fields, check_value, command_line, field_ranges, option_name


def test_range_rules_and_messages():
    r = Range(gt=0, le=1)
    assert r.problem(0.5) is None and r.problem(1) is None and r.problem(None) is None
    assert r.problem(0.0) == (0.0, "a finite number > 0 and <= 1")
    assert r.problem(float("nan"))[0] != r.problem(float("nan"))[0]  # the NaN itself
    assert r.problem(True) == (True, "a finite number > 0 and <= 1")  # a bool is not a number here
    assert r.problem("0.5") is not None and r.problem(2) == (2, "an integer > 0 and <= 1")
    assert Range(gt=0, finite=False).problem(math.inf) is None and Range(gt=0).problem(math.inf) is not None
    seq = Range(gt=0, min_len=1)
    assert seq.problem((1.0, 2.0)) is None and seq.problem(()) == ((), "1 or more values")
    assert seq.problem((1.0, -1.0)) == (-1.0, "a finite number > 0 (each value)")


@dataclass
class _Cfg:
    a: Annotated[float, Range(gt=0)] = 1.0
    b: Optional[Annotated[int, Range(ge=1)]] = None
    c: Annotated[Tuple[float, ...], Range(min_len=1)] = (1.0,)
    name: str = "x"

    def __post_init__(self):
        check_fields(self)


@dataclass
class _Sub(_Cfg):
    a: float = 2.0  # re-declared without a Range (as the command line's renamed views do): the base's holds


def test_check_fields_names_the_field_and_the_option_given():
    with pytest.raises(RangeError, match=r"^_Cfg.a: must be a finite number > 0, got nan$"):
        _Cfg(a=float("nan"))
    with pytest.raises(RangeError, match=r"_Cfg.b: must be an integer >= 1, got 0"):
        _Cfg(b=0)
    with pytest.raises(RangeError, match=r"_Cfg.a: must be a finite number > 0, got -1"):
        _Sub(a=-1.0)
    assert set(field_ranges(_Sub)) == {"a", "b", "c"}
    with command_line(["--x.a", "-1"]), pytest.raises(RangeError, match=r"^--x.a \(_Cfg.a\): "):
        _Sub(a=-1.0)
    assert option_name(_Cfg, "a", ["--c", "1"]) is None
    assert check_value("t", 0.5, Annotated[float, Range(ge=0, le=1)]) == 0.5
    with pytest.raises(ConfigError, match="t: must be"):
        check_value("t", 1.5, Annotated[float, Range(ge=0, le=1)])


def _config_classes():
    from rh3dgs.cli import OrbitOptions
    from rh3dgs.data.synthetic import SceneConfig
    from rh3dgs.data.teacher_sim import TeacherSimConfig
    from rh3dgs.data.teacher_sim_masks import MaskTeacherSimConfig
    from rh3dgs.distill import DistillConfig
    from rh3dgs.io.transforms import ImageOptions
    from rh3dgs.lifting import LiftConfig
    from rh3dgs.method.lic import LICConfig
    from rh3dgs.method.objective import ObjectiveConfig
    from rh3dgs.method.selection import SelectionConfig
    from rh3dgs.method.sphere import FrechetMeanConfig
    from rh3dgs.method.vcd import VCDConfig
    from rh3dgs.method.vfm import VFMConfig
    from rh3dgs.teachers import TeacherConfig
    from rh3dgs.viewer.controls import ControlState
    from rh3dgs.viewer.server import ViewerConfig

    return [LiftConfig, VCDConfig, VFMConfig, FrechetMeanConfig, LICConfig, ObjectiveConfig, SceneConfig, ImageOptions,
            TeacherConfig, ViewerConfig, DistillConfig, ControlState, OrbitOptions, TeacherSimConfig,
            MaskTeacherSimConfig, SelectionConfig]


def _outside(r: Range, sample):
    """A value just outside ``r`` (an empty tuple where a length is asked, NaN where only finiteness is)."""
    if r.min_len:
        return ()
    for bound, step in ((r.ge, -1), (r.gt, 0), (r.le, 1), (r.lt, 0)):
        if bound is not None:
            return int(bound + step) if isinstance(sample, int) and not isinstance(sample, bool) else float(bound + step)
    return float("nan")


@pytest.mark.parametrize("cls", _config_classes(), ids=lambda c: c.__name__)
def test_every_declared_range_is_enforced_on_construction(cls):
    """Each config class: the defaults pass; each field set just outside its range (or NaN / empty) is refused
    with the class and field named."""
    ranges = field_ranges(cls)
    assert ranges, cls
    base = cls()
    for name, rs in ranges.items():
        default = getattr(base, name)
        sample = default if default is not None else (1 if "int" in str(cls.__dataclass_fields__[name].type) else 1.0)
        bad = _outside(rs[0], sample)
        with pytest.raises(RangeError, match=rf"{name}: must be"):
            dataclasses.replace(base, **{name: bad})
        if isinstance(sample, float):
            with pytest.raises(RangeError, match=rf"{name}: must be"):
                dataclasses.replace(base, **{name: float("nan")})


def test_presets_rh3dgs_json_and_stored_runs_are_checked_the_same_way(tmp_path):
    import rh3dgs
    from fuzz.targets import seed_dir
    from rh3dgs.lifting import LiftConfig
    from rh3dgs.presets import load_preset

    (tmp_path / "p.yaml").write_text("delta: -0.5\nvcd:\n  edge_radius: 2\n")
    with pytest.raises(ConfigError, match=r"p.yaml: LiftConfig.delta: must be a finite number > 0, got -0.5"):
        load_preset(tmp_path / "p.yaml", LiftConfig)
    (tmp_path / "q.yaml").write_text("vcd:\n  eps: .nan\n")
    with pytest.raises(ConfigError, match=r"q.yaml.*VCDConfig.eps: must be"):
        load_preset(tmp_path / "q.yaml", LiftConfig)
    # a scene whose rh3dgs.json names a teacher setting out of range: one line at the first text query
    scene = tmp_path / "scene"
    shutil.copytree(seed_dir() / "scene", scene)
    meta = json.loads((scene / "rh3dgs.json").read_text())
    meta["teacher"] = {"name": "tiny-clip", "batch_size": 0}
    (scene / "rh3dgs.json").write_text(json.dumps(meta))
    s = rh3dgs.load(scene)
    with pytest.raises(InputFileError, match=r"rh3dgs.json \[teacher\].*TeacherConfig.batch_size: must be"):
        s.encode(["a phrase not stored"])


def test_a_stored_run_config_out_of_range_is_refused_naming_the_line(tmp_path):
    import yaml

    from rh3dgs.io.nerfstudio_run import NerfstudioRunError, load_run_config
    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    text = yaml.dump(rh3dgs_lite_config()).replace("latent_dim: 8", "latent_dim: 0", 1)
    (tmp_path / "config.yml").write_text(text)
    with pytest.raises(NerfstudioRunError, match=r"config.yml: line \d+: .*Rh3dgsModelConfig.latent_dim: must be an "
                                                 r"integer >= 1, got 0"):
        load_run_config(tmp_path / "config.yml")
