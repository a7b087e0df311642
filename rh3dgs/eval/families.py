"""The families of the ground-truth suite and its development / test split (fixed before any score).

The suite of issue 16 (5 table-top layouts x 4 simulated teachers, one seed, 24 views) was the
simulator every method choice of the trained field was made on, and it overstated the trained
field's 2D gain on scenes it had never seen (issue 46). This module widens it into *families* and
splits them into a **development** part, the only one method choices may be made on, and a
**test** part, run once per candidate and reported as it comes out. Everything here was written
and committed before any method was scored on these families; changing it after a score was seen
would turn the test part into a development part.

Scene families (:data:`SCENE_FAMILIES`; ``layout`` names a layout of :mod:`rh3dgs.data.synthetic`)
-------------------------------------------------------------------------------------------------
The five layouts of the old suite (``tabletop``, ``table``, ``stacks``, ``small objects``,
``occlusion``: fixed object sets, seed-jittered positions), and five new ones:

``cluttered`` (procedural)
    10 objects drawn from the *object bank* below, centres uniform in [-0.8, 0.8]^2 by rejection
    sampling so that the footprints (bounding circles) are 0.01 to 0.03 apart: many small objects
    touching and hiding each other.
``sparse`` (procedural)
    3 bank objects at 1.5x the bank's sizes on a circle of radius 0.9 around the centre, 120 degrees
    apart (+- 20 degrees jitter): a large, mostly empty floor.
``textured`` (procedural)
    6 bank objects placed as ``cluttered`` but in [-0.7, 0.7]^2 with gaps of at least 0.05, each
    with a strong texture chosen by the seed: stripes (period 0.08 along the height), checker (cells of
    0.06) or blotches (per-Gaussian colour noise of std 0.15). The stripes' and checker's second
    colour is another colour of the palette, so colour no longer tells the class.
``same-colour`` (fixed set)
    Touching objects of one colour and different classes: a white table (top + 4 legs) with a white mug
    on it, a red crate with a red box on it, a green ball touching a green cylinder, a grey pedestal with
    a grey vase on it, and a blue upright ring.
``thin`` (fixed set)
    Thin structures: a black pole (radius 0.015, height 0.9), a silver pole (0.012, 0.7), a fence (two
    posts of radius 0.012 and 3 horizontal bars 0.6 x 0.016 x 0.016), an orange upright ring (radius 0.2,
    tube 0.012), a stool (seat of radius 0.15 at height 0.4 on 3 legs of radius 0.01) and a green wire
    (a torus of radius 0.3 and tube 0.008 lying on the floor).

The *object bank* of the procedural layouts: sphere (radius 0.06-0.14), box (half extents 0.05-0.12
each), cylinder (radius 0.04-0.09, height 0.10-0.35), torus lying on the floor (radius 0.07-0.12, tube
0.02-0.035), open bowl (radius 0.08-0.14), upright ring (radius 0.08-0.14, tube 0.015-0.025); sizes
uniform in their ranges. Each object takes a distinct colour of a 10-colour palette (red, blue, green,
yellow, orange, purple, white, black, pink, cyan) and is the class "<colour> <shape>".

Teacher families (:data:`TEACHER_FAMILIES`)
-------------------------------------------
The four presets of the old suite (``clip-moderate``, ``clip-strong``, ``sam-moderate``, ``sam-strong``)
and five new ones (simulator fields of :mod:`rh3dgs.data.teacher_sim` / :mod:`rh3dgs.data.teacher_sim_masks`;
``view_failure_mode`` / ``failure_mode`` and ``level_probs`` are new fields):

``clip-fine``
    A finer ViT grid (patch 4 px, e.g. FeatUp-upsampled tokens) whose tokens are noisier: noise 9 degrees,
    2 % outlier tokens.
``clip-coarse``
    A coarse grid with a large receptive field: patch 16 px, the patch grid blurred by 1 patch (context),
    occlusion contamination 0.6.
``clip-vcorr``
    View-correlated failures: each class is misrecognised (a confuser's prototype, one confuser per class)
    in every view whose camera azimuth lies in one arc of 72 degrees (20 % of the orbit) at a random centre,
    instead of in independent views.
``sam-multilevel``
    SAM's multi-level masks: per view one granularity, parts (p 0.3), whole objects (p 0.4) or groups
    (p 0.3). Parts: every mask of at least 2x ``min_mask_px`` is cut by 1-2 random lines through its
    centroid (up to 4 parts), each part's embedding is ``normalize(0.7 own + 0.3 cone centre)`` (a part
    looks generic) and misrecognised at twice ``failure_rate``. Groups: every mask is merged with an
    adjacent one with probability 0.6 (besides ``merge_rate``).
``sam-vcorr``
    The moderate mask teacher with view-correlated recognition failures: as ``clip-vcorr``, per class an
    arc of 72 degrees of camera azimuth in which every mask of the class gets its confuser's embedding.

View budgets (:data:`VIEW_BUDGETS`): 6, 12, 24 or 48 training views on the orbit (3 heights), always
8 held-out views between them; 128 x 128 px; 150 training steps.

The split (:func:`part_pairs`)
------------------------------
* development: 8 scene families (the old five, ``cluttered``, ``textured``, ``thin``) x 7 teacher
  families (the old four, ``clip-fine``, ``clip-vcorr``, ``sam-multilevel``); each teacher family is
  paired with 6 of the scene families (a cyclic design: teacher j with scenes j, j + 1, ..., j + 5 mod 8),
  42 pairs, pair k seeded 4600 + k.
* test: 10 scene families (the development ones and ``sparse``, ``same-colour``, interleaved) x 9 teacher
  families (the development ones and ``clip-coarse``, ``sam-vcorr``); each teacher family with 5 scene
  families (teacher j with scenes j, ..., j + 4 mod 10), 45 pairs, pair k seeded 4700 + k.
* the view budget of the t-th pair of teacher family j is ``VIEW_BUDGETS[(t + 2 j) % 4]``: every budget
  appears with every teacher family and with nearly every scene family.

The seeds of both parts differ from those of the old suite (0) and of its development draws (1000-3000);
a pair's scene and teacher use its seed. Two families (``sparse``, ``same-colour``) and two teacher
families (``clip-coarse``, ``sam-vcorr``) appear only in the test part.

>>> len(part_pairs("dev")), len(part_pairs("test"))
(42, 45)
>>> sorted({p.views for p in part_pairs("dev")})
[6, 12, 24, 48]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

__all__ = ["SceneFamily", "TeacherFamily", "SuitePair", "SCENE_FAMILIES", "TEACHER_FAMILIES", "VIEW_BUDGETS",
           "DEV_SCENES", "DEV_TEACHERS", "TEST_SCENES", "TEST_TEACHERS", "PART_SEEDS", "PARTS", "part_pairs"]


@dataclass(frozen=True)
class SceneFamily:
    """A family of synthetic scenes: a layout of :mod:`rh3dgs.data.synthetic` (its draw is the pair's seed)."""

    name: str
    layout: str
    description: str


@dataclass(frozen=True)
class TeacherFamily:
    """A simulated teacher: ``kind`` "clip" (:class:`~rh3dgs.data.teacher_sim.TeacherSimConfig`) or "sam"
    (:class:`~rh3dgs.data.teacher_sim_masks.MaskTeacherSimConfig`) with these field overrides."""

    name: str
    kind: str
    overrides: Tuple[Tuple[str, object], ...]
    description: str

    def config_overrides(self) -> Dict[str, object]:
        return dict(self.overrides)


@dataclass(frozen=True)
class SuitePair:
    """One (scene draw, teacher draw, view budget) of a part: every row of the suite runs on it."""

    part: str
    index: int
    scene: str
    teacher: str
    views: int
    seed: int

    @property
    def key(self) -> str:
        return f"{self.part}{self.index:02d}"


SCENE_FAMILIES: Dict[str, SceneFamily] = {f.name: f for f in [
    SceneFamily("tabletop", "tabletop", "the old suite's layout 0: balls, a box, a cylinder, a torus, a bowl with a "
                                        "ball inside, a thin pole"),
    SceneFamily("table", "table", "layout 1: a table with thin legs, a mug on it, a cube under it, a pot, a lamp"),
    SceneFamily("stacks", "stacks", "layout 2: objects on others, a thin upright ring, a marble"),
    SceneFamily("small objects", "small objects", "layout 3: small objects in front of and behind a wall"),
    SceneFamily("occlusion", "occlusion", "layout 4: a tall cabinet between objects, a chair with thin legs"),
    SceneFamily("cluttered", "cluttered", "10 bank objects, touching and hiding each other"),
    SceneFamily("sparse", "sparse", "3 large bank objects far apart on an empty floor"),
    SceneFamily("textured", "textured", "6 bank objects with stripes, checker or blotches of other colours"),
    SceneFamily("same-colour", "same-colour", "touching objects of one colour and different classes"),
    SceneFamily("thin", "thin", "poles, a fence, a ring, a stool's legs, a wire"),
]}

TEACHER_FAMILIES: Dict[str, TeacherFamily] = {f.name: f for f in [
    TeacherFamily("clip-moderate", "clip", (), "TeacherSimConfig defaults (patch 8, noise 6 deg, 5 % view failures)"),
    TeacherFamily("clip-strong", "clip", (("patch_size", 12), ("context_sigma", 0.5), ("view_failure_rate", 0.15),
                                          ("noise_deg", 10.0), ("outlier_fraction", 0.03),
                                          ("occlusion_contamination", 0.7)), "the old suite's strong CLIP-like teacher"),
    TeacherFamily("clip-fine", "clip", (("patch_size", 4), ("noise_deg", 9.0), ("outlier_fraction", 0.02)),
                  "a finer, noisier token grid"),
    TeacherFamily("clip-coarse", "clip", (("patch_size", 16), ("context_sigma", 1.0), ("occlusion_contamination", 0.6)),
                  "a coarse grid with a large receptive field"),
    TeacherFamily("clip-vcorr", "clip", (("view_failure_rate", 0.2), ("view_failure_mode", "azimuth")),
                  "a class misrecognised over one 72-degree arc of camera azimuth"),
    TeacherFamily("sam-moderate", "sam", (), "MaskTeacherSimConfig defaults"),
    TeacherFamily("sam-strong", "sam", (("merge_rate", 0.25), ("split_rate", 0.2), ("miss_rate", 0.1),
                                        ("failure_rate", 0.2), ("context", 0.3), ("noise_deg", 10.0),
                                        ("edge_jitter_px", 2.0)), "the old suite's strong mask teacher"),
    TeacherFamily("sam-multilevel", "sam", (("level_probs", (0.3, 0.4, 0.3)),),
                  "per view parts, whole objects or groups of masks"),
    TeacherFamily("sam-vcorr", "sam", (("failure_rate", 0.2), ("failure_mode", "azimuth")),
                  "a class misrecognised over one 72-degree arc of camera azimuth"),
]}

VIEW_BUDGETS: Tuple[int, ...] = (6, 12, 24, 48)

DEV_SCENES: Tuple[str, ...] = ("tabletop", "table", "stacks", "small objects", "occlusion", "cluttered", "textured",
                               "thin")
DEV_TEACHERS: Tuple[str, ...] = ("clip-moderate", "sam-moderate", "clip-strong", "sam-strong", "clip-fine",
                                 "sam-multilevel", "clip-vcorr")
TEST_SCENES: Tuple[str, ...] = ("tabletop", "sparse", "table", "stacks", "small objects", "same-colour", "occlusion",
                                "cluttered", "textured", "thin")
TEST_TEACHERS: Tuple[str, ...] = ("clip-moderate", "sam-moderate", "clip-strong", "sam-strong", "clip-fine",
                                  "sam-multilevel", "clip-vcorr", "clip-coarse", "sam-vcorr")
#: the first pair's seed of each part (pair k: seed + k)
PART_SEEDS: Dict[str, int] = {"dev": 4600, "test": 4700}
#: per part: (scene families, teacher families, scene families per teacher family)
PARTS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...], int]] = {
    "dev": (DEV_SCENES, DEV_TEACHERS, 6),
    "test": (TEST_SCENES, TEST_TEACHERS, 5),
}


def part_pairs(part: str) -> List[SuitePair]:
    """The pairs of a part (module docstring): teacher family j with scene families j .. j + k - 1 (mod S), the t-th
    of them with ``VIEW_BUDGETS[(t + 2 j) % 4]`` training views."""
    if part not in PARTS:
        raise KeyError(f"unknown suite part {part!r}; known: {list(PARTS)}")
    scenes, teachers, k = PARTS[part]
    out: List[SuitePair] = []
    for j, teacher in enumerate(teachers):
        for t in range(k):
            out.append(SuitePair(part, len(out), scenes[(j + t) % len(scenes)], teacher,
                                 VIEW_BUDGETS[(t + 2 * j) % len(VIEW_BUDGETS)], PART_SEEDS[part] + len(out)))
    return out
