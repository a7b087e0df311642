"""rh3dgs.eval.families: the widened suite's families, its development / test split, and the scene layouts and teacher
settings the families name (rh3dgs.data.synthetic, rh3dgs.data.teacher_sim*)."""
from collections import Counter

import pytest
import torch

from rh3dgs.data.synthetic import PROCEDURAL_LAYOUTS, SceneConfig, camera_azimuths, layout_names, make_scene
from rh3dgs.data.teacher_sim import TeacherSimConfig
from rh3dgs.data.teacher_sim_masks import MaskTeacherSimConfig
from rh3dgs.errors import ConfigError
from rh3dgs.eval.families import (DEV_SCENES, DEV_TEACHERS, PARTS, SCENE_FAMILIES, TEACHER_FAMILIES, TEST_SCENES,
                                  TEST_TEACHERS, VIEW_BUDGETS, part_pairs)


def test_the_split_is_balanced_and_the_parts_do_not_share_a_seed():
    dev, test = part_pairs("dev"), part_pairs("test")
    assert (len(dev), len(test)) == (42, 45)
    assert not {p.seed for p in dev} & {p.seed for p in test}
    assert not {p.seed for p in dev + test} & {0, *range(1000, 1005), *range(2000, 2005), *range(3000, 3005)}
    for part, pairs in (("dev", dev), ("test", test)):
        scenes, teachers, k = PARTS[part]
        assert Counter(p.teacher for p in pairs) == {t: k for t in teachers}
        assert set(Counter(p.scene for p in pairs).values()) <= {k * len(teachers) // len(scenes),
                                                                 k * len(teachers) // len(scenes) + 1}
        for t in teachers:  # every teacher family meets every view budget
            assert {p.views for p in pairs if p.teacher == t} == set(VIEW_BUDGETS)
    only_test = {"sparse", "same-colour", "clip-coarse", "sam-vcorr"}
    assert only_test == (set(TEST_SCENES) | set(TEST_TEACHERS)) - (set(DEV_SCENES) | set(DEV_TEACHERS))
    assert set(DEV_SCENES) < set(TEST_SCENES) and set(DEV_TEACHERS) < set(TEST_TEACHERS)
    with pytest.raises(KeyError):
        part_pairs("train")


def test_every_family_builds():
    """Each scene family's layout exists and makes a scene with unique class names; each teacher family's settings
    are valid simulator settings."""
    assert {f.layout for f in SCENE_FAMILIES.values()} <= set(layout_names())
    for f in TEACHER_FAMILIES.values():
        (TeacherSimConfig if f.kind == "clip" else MaskTeacherSimConfig)(**f.config_overrides())
    for name in PROCEDURAL_LAYOUTS:
        a, b = (make_scene(SceneConfig(layout=name, seed=s, gaussians_per_unit_area=300.0, num_views=3, image_size=16))
                for s in (1, 2))
        assert len(set(a.class_names)) == len(a.class_names) and a.class_names != b.class_names  # the seed draws
        assert torch.equal(a.gaussians.means, make_scene(SceneConfig(layout=name, seed=1, gaussians_per_unit_area=300.0,
                                                                     num_views=3, image_size=16)).gaussians.means)
    with pytest.raises(ConfigError, match="unknown layout"):
        SceneConfig(layout="nope")


def test_fixed_layouts_by_name_and_camera_azimuths():
    a = make_scene(SceneConfig(layout="table", seed=3, gaussians_per_unit_area=300.0, num_views=4, image_size=16))
    b = make_scene(SceneConfig(layout=1, seed=3, gaussians_per_unit_area=300.0, num_views=4, image_size=16))
    assert torch.equal(a.gaussians.means, b.gaussians.means) and a.class_names == b.class_names
    same = make_scene(SceneConfig(layout="same-colour", seed=3, gaussians_per_unit_area=300.0, num_views=4,
                                  image_size=16))
    colours = {n: same.gaussians.base_colors[same.class_ids == k].mean(0) for k, n in enumerate(same.class_names)}
    for a_, b_ in (("white mug", "white table"), ("red box", "red crate"), ("grey vase", "grey pedestal")):
        torch.testing.assert_close(colours[a_], colours[b_], atol=0.03, rtol=0)
    az = camera_azimuths(a.cameras)  # orbit_cameras: azimuth 2 pi i / n + 0.3
    assert az == pytest.approx([0.3 + 2 * torch.pi * i / 4 - (2 * torch.pi if i >= 2 else 0) for i in range(4)],
                               abs=1e-5)
