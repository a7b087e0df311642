"""The semantic half of ``rh3dgs demo``: simulated teacher -> lift / training -> text queries -> metrics.

The demo scene has held-out cameras (never used by any method); the synthetic scene's exact labels
are the ground truth, so the printed numbers measure the method the way the suite does
(:mod:`rh3dgs.eval.suite`): held-out 2D mIoU / mBIoU (3D-OVS argmax protocol) and 3D mIoU over every
Gaussian of opacity > 0.1, for the Euclidean lift (the LUDVIG-style baseline), our training-free
robust lift + VCD, and the field trained from it (:func:`rh3dgs.distill.distill`, the objective of
``ns-train rh3dgs``), with each row's difference to the baseline.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import torch

from .api import load
from .data.labelled import LabelledDataset
from .data.teacher_sim import TeacherSimConfig, simulate_teacher
from .distill import DistillConfig, distill
from .errors import ConfigError
from .eval.scoring import score_gaussians, score_views
from .io.atomic import atomic_save_json, atomic_save_png
from .io.scene import save_scene
from .lifting import LiftConfig, lift
from .query import CANONICAL_NEGATIVES, THRESHOLD
from .rendering import fixed_views
from .teachers import PrecomputedTeacher
from .viz import highlight, result_sheet, with_colorbar

__all__ = ["run", "DEMO_ROWS"]

BASELINE = "Euclidean lift (baseline)"
#: (row, what it runs): the comparison ``make demo`` prints, a subset of the suite's rows.
DEMO_ROWS = (BASELINE, "rh3dgs robust lift + VCD", "rh3dgs trained (from the lift)")


def run(scene, out: Path, args) -> str:
    if scene.heldout_cameras is None:
        raise ConfigError("the demo scene needs held-out cameras (SceneConfig.heldout_views > 0)")
    t0 = time.time()
    data = out / "data"
    sim = simulate_teacher(data, TeacherSimConfig(seed=getattr(args, "seed", 0)))
    teacher = PrecomputedTeacher(features_dir=sim.features_dir)
    train, test = scene.cameras, scene.heldout_cameras
    classes = scene.class_names
    text = teacher.encode_text(classes)  # [K, D]
    negatives = teacher.encode_text(list(CANONICAL_NEGATIVES))
    print(f"[3/5] simulated CLIP-like teacher (D={text.shape[1]}) -> {sim.features_dir}")

    def maps(i: int) -> torch.Tensor:  # training views only: held-out views are never seen by a method
        return teacher.load_feature_map(train.names[i])

    labelled = LabelledDataset.open(data)
    gt_test = [labelled.mask(n) for n in test.names]
    test_views = fixed_views(scene.gaussians, test)
    gt3d = scene.class_ids.numpy()
    opac = scene.gaussians.activated_opacities
    fields, results = {}, {}
    for label in DEMO_ROWS:
        t = time.perf_counter()
        if label == BASELINE:
            res = lift(scene.gaussians, train, maps, LiftConfig(method="euclidean", use_vcd=False, guided=False))
        elif label == DEMO_ROWS[1]:
            res = lift(scene.gaussians, train, maps, LiftConfig())
            robust = res
        else:
            res = distill(scene.gaussians, train, maps, DistillConfig(), progress=True, init_lift=robust)
        seconds = time.perf_counter() - t
        fld = fields[label] = res.field()
        with torch.no_grad():
            lat = test_views.render(fld.latents, range(len(test_views)))
        ev = score_views(fld, list(lat), list(test_views.alpha), gt_test, text, negatives)
        ev.update(score_gaussians(fld, text, gt3d, opac))
        results[label] = {"miou": ev["miou"], "mbiou": ev["mbiou"], "miou_3d": ev["miou_3d"],
                          "miou_3d_nofill": ev["miou_3d_nofill"], "seconds": seconds}
    print(f"[4/5] lifted and trained {len(scene.gaussians)} Gaussians on {len(train)} views, scored on "
          f"{len(test)} held-out views")

    # Two semantic scenes: the robust lift (what `rh3dgs lift` writes; `rh3dgs view OUT/scene`), whose 3D
    # selections hold fewer Gaussians around an object than the trained field's (training fits the teacher's
    # halo into the floor around the object), and the trained field (OUT/scene_trained).
    best = DEMO_ROWS[1]
    for folder, row in (("scene", best), ("scene_trained", DEMO_ROWS[-1])):
        save_scene(out / folder, scene.gaussians, fields[row], train,
                   image_paths=[data / "images" / f"{n}.png" for n in train.names],
                   teacher={"name": "precomputed", "features_dir": str(Path(sim.features_dir).resolve())},
                   info={"row": row})
    scene_dir = out / "scene"
    api_scene = load(scene_dir)
    qdir = out / "queries"
    queries = [c for c in classes if c != "floor"]
    shown = [0, len(train) // 3, 2 * len(train) // 3]
    for i in shown:
        rel = api_scene.render_relevancy(i, queries)
        rgb = api_scene.render(i)
        for q, r in zip(queries, rel):
            atomic_save_png(qdir / f"{train.names[i]}_{q.replace(' ', '_')}.png", with_colorbar(
                highlight(rgb, r, threshold=THRESHOLD), 0.0, 1.0, f"relevancy above {THRESHOLD:g} (0-1)", THRESHOLD))
        atomic_save_png(qdir / "sheets" / f"{train.names[i]}.png", result_sheet(rgb, rel[:4], queries[:4], THRESHOLD,
                                                                            title=f"{train.names[i]}: text queries"))
    sel_lines = []
    for q in queries[:3]:
        sel = api_scene.select(q)
        k = classes.index(q)
        gt = scene.class_ids == k
        inter = int((sel & gt).sum())
        api_scene.export_ply(qdir / f"{q.replace(' ', '_')}.ply", mask=sel)
        sel_lines.append(f"  '{q}': selected {int(sel.sum())} Gaussians, {inter}/{int(gt.sum())} of the object's "
                         f"(IoU {inter / max(1, int((sel | gt).sum())):.3f}) -> {q.replace(' ', '_')}.ply")
    atomic_save_json(out / "metrics.json", {"results": results, "classes": classes, "heldout_views": test.names,
                                            "seconds": time.time() - t0})
    print(f"[5/5] result sheets (render, relevancy, selection per query; start here) -> {qdir / 'sheets'}; single "
          f"PNGs and selections -> {qdir}; semantic scenes: {best} -> {scene_dir}, {DEMO_ROWS[-1]} -> "
          f"{out / 'scene_trained'}")
    head = f"3D selections of {scene_dir.name}/ ({best}, threshold {THRESHOLD}):\n"
    return _table(results) + "\n" + head + "\n".join(sel_lines) + \
        f"\nmetrics: {out / 'metrics.json'}"


def _table(results: Dict[str, dict]) -> str:
    base = results[BASELINE]
    lines = ["", f"held-out views: 2D mIoU / mBIoU (3D-OVS argmax), 3D mIoU over opacity > 0.1; "
                 f"(+x) = difference to the {BASELINE.lower()}",
             "| method | 2D mIoU | 2D mBIoU | 3D mIoU | seconds |", "|---|---|---|---|---|"]
    for label, r in results.items():
        cells = []
        for m in ("miou", "mbiou", "miou_3d"):
            d = "" if label == BASELINE else f" ({100 * (r[m] - base[m]):+.2f})"
            cells.append(f"{100 * r[m]:.2f}{d}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {r['seconds']:.1f} |")
    return "\n".join(lines)
