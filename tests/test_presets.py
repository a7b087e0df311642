"""YAML presets in configs/ load into the config dataclasses; bad presets give clear errors."""
from pathlib import Path

import pytest

from rh3dgs.errors import ConfigError
from rh3dgs.lifting import LiftConfig
from rh3dgs.presets import load_preset
from rh3dgs.method.vcd import VCDConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("lift-*.yaml")))
def test_shipped_lift_presets_load(name):
    cfg = load_preset(ROOT / "configs" / name, LiftConfig)
    assert isinstance(cfg, LiftConfig) and isinstance(cfg.vcd, VCDConfig)


def test_robust_preset_equals_the_defaults():
    assert load_preset(ROOT / "configs" / "lift-robust.yaml", LiftConfig) == LiftConfig()


def test_euclidean_preset_is_the_baseline():
    cfg = load_preset(ROOT / "configs" / "lift-euclidean.yaml", LiftConfig)
    assert cfg.method == "euclidean" and cfg.use_vcd is False and cfg.guided is False


@pytest.mark.parametrize("text,match", [
    ("metod: robust\n", r"\[metod\]: unknown field of LiftConfig"),
    ("delta: fast\n", r"\[delta\]: expected float"),
    ("vcd:\n  use_edges: true\n", r"\[vcd.use_edges\]: unknown field of VCDConfig"),
    ("method: median\n", "method must be"),
    ("- a\n- b\n", "expected a mapping"),
    ("delta: [1, 2\n", "not valid YAML"),
])
def test_bad_presets_name_file_and_key(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_preset(p, LiftConfig)
    assert str(p) in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_preset(tmp_path / "missing.yaml", LiftConfig)
