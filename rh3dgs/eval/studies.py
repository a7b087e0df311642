"""Cause studies of issue 46 (development only, not part of the suite's families): why the trained field gains in
3D everywhere but not in 2D on unseen scenes (docs/method.md, "Where training moves held-out pixels").

Two kinds, both run by :func:`rh3dgs.eval.suite.run_suite` with its study knobs:

* :data:`PERTURBATIONS`: the development pairs of :data:`STUDY_PAIRS` with one thing changed that the families keep
  fixed: the methods get a jittered *reconstruction* of the scene's Gaussians (``geometry_noise``), the scenes are made
  of overlapping isotropic Gaussians (``gaussian_style="blob"``), or the held-out views are closer than any training
  view (``heldout_radius``).
* :data:`CORRUPTIONS`: the teacher with one corruption at a time (from the clean teacher of each kind), on two layouts
  (:func:`corruption_study_config`), so that what training does to the held-out pixels can be read per corruption.

>>> sorted(PERTURBATIONS)
['blob', 'closeup', 'recon']
>>> len(CORRUPTIONS)
13
"""
from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["STUDY_PAIRS", "PERTURBATIONS", "CORRUPTIONS", "corruption_study_config"]

#: Two development pairs of each development teacher family, at 12 or 24 training views.
STUDY_PAIRS: Tuple[int, ...] = (1, 2, 6, 9, 13, 14, 18, 21, 25, 26, 30, 33, 37, 38)

#: name -> :class:`~rh3dgs.eval.suite.SuiteConfig` overrides.
PERTURBATIONS: Dict[str, Dict[str, object]] = {
    "recon": dict(geometry_noise=1.0),
    "blob": dict(gaussian_style="blob"),
    "closeup": dict(heldout_radius=1.5),
}

_CLIP_CLEAN = dict(bleed=0.0, context_sigma=0.0, occlusion_contamination=0.0, view_failure_rate=0.0, noise_deg=0.0,
                   outlier_fraction=0.0, text_jitter_deg=0.0)
_SAM_CLEAN = dict(merge_rate=0.0, split_rate=0.0, miss_rate=0.0, failure_rate=0.0, context=0.0, noise_deg=0.0,
                  edge_jitter_px=0.0)

#: One corruption at a time, at the strong presets' levels: name -> (kind, simulator settings).
CORRUPTIONS: Dict[str, Tuple[str, Dict[str, object]]] = {
    "clip clean": ("clip", dict(_CLIP_CLEAN)),
    "clip + patch mixing": ("clip", {**_CLIP_CLEAN, "bleed": 1.0}),
    "clip + context": ("clip", {**_CLIP_CLEAN, "context_sigma": 1.0}),
    "clip + occlusion": ("clip", {**_CLIP_CLEAN, "occlusion_contamination": 0.7}),
    "clip + view failures": ("clip", {**_CLIP_CLEAN, "view_failure_rate": 0.15}),
    "clip + noise": ("clip", {**_CLIP_CLEAN, "noise_deg": 10.0, "outlier_fraction": 0.03}),
    "sam clean": ("sam", dict(_SAM_CLEAN)),
    "sam + merges": ("sam", {**_SAM_CLEAN, "merge_rate": 0.25}),
    "sam + splits": ("sam", {**_SAM_CLEAN, "split_rate": 0.2}),
    "sam + misses": ("sam", {**_SAM_CLEAN, "miss_rate": 0.1}),
    "sam + failures": ("sam", {**_SAM_CLEAN, "failure_rate": 0.2}),
    "sam + context": ("sam", {**_SAM_CLEAN, "context": 0.3}),
    "sam + edge jitter": ("sam", {**_SAM_CLEAN, "edge_jitter_px": 2.0}),
}


def corruption_study_config(**overrides):
    """The corruption study: layouts tabletop and cluttered (seeds 4800, 4801) x :data:`CORRUPTIONS`, 12 training
    views; ``overrides`` (e.g. ``geometry_noise``, ``rows``) win."""
    from .suite import SuiteConfig

    base = dict(layouts=("tabletop", "cluttered"), teachers=tuple(CORRUPTIONS), seed=4800, num_views=12,
                extra_teachers=dict(CORRUPTIONS), qualitative=(), save_scenes="none", threads=1)
    base.update(overrides)
    return SuiteConfig(**base)
