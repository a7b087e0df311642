"""The semantic half of ``rh3dgs demo``: simulated teacher -> lift -> text queries -> metrics.

Uses the synthetic scene's exact labels as ground truth, so the printed numbers measure
the method: per-Gaussian (3D) and per-pixel (2D, 3D-OVS argmax protocol) mIoU for our
robust lift and for the Euclidean / no-VCD baseline behind the same call.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import torch

from .api import load
from .data.labelled import LabelledDataset
from .data.teacher_sim import TeacherSimConfig, simulate_teacher
from .eval.metrics import miou_3d, semantic_miou
from .io.atomic import atomic_save_json, atomic_save_png
from .io.scene import save_scene
from .lifting import LiftConfig, lift
from .query import THRESHOLD
from .rendering import render
from .teachers import PrecomputedTeacher
from .viz import highlight, result_sheet

__all__ = ["run"]


def _scores(features: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    return features @ text.T


def run(scene, out: Path, args) -> str:
    t0 = time.time()
    data = out / "data"
    sim = simulate_teacher(data, TeacherSimConfig(seed=getattr(args, "seed", 0)))
    teacher = PrecomputedTeacher(features_dir=sim.features_dir)
    names = scene.cameras.names
    classes = scene.class_names
    text = teacher.encode_text(classes)  # [K, D]
    print(f"[3/5] simulated CLIP-like teacher (D={text.shape[1]}) -> {sim.features_dir}")

    def maps(i: int) -> torch.Tensor:
        return teacher.load_feature_map(names[i])

    labelled = LabelledDataset.open(data)
    results: Dict[str, dict] = {}
    lifted = {}
    for label, cfg in [("rh3dgs (VCD + robust Frechet)", LiftConfig(method="robust")),
                       ("baseline (Euclidean mean, no VCD)", LiftConfig(method="euclidean", use_vcd=False))]:
        res = lift(scene.gaussians, scene.cameras, maps, cfg)
        lifted[label] = res
        pred3d = _scores(res.features, text).argmax(-1)
        pred3d[~res.valid] = -1
        gt3d = scene.class_ids.clone()
        m3 = miou_3d(pred3d, gt3d, num_classes=len(classes))
        # 2D: render decoded features, argmax over classes (3D-OVS protocol), vs GT masks
        f = res.field()
        ious = []
        for i in range(len(scene.cameras)):
            with torch.no_grad():
                r = render(scene.gaussians, scene.cameras[i], f.latents, rgb=False)
            cos = f.cosine(r.features[0], text)  # [H, W, K]
            pred = cos.argmax(-1)
            pred[r.alpha[0] < 0.5] = 255
            gt = torch.from_numpy(labelled.mask(names[i]))
            ious.append(semantic_miou(pred, gt, num_classes=len(classes)))
        m2 = float(sum(ious) / len(ious))
        results[label] = {"miou_3d": float(m3), "miou_2d": m2, "seconds": res.info["seconds"],
                          "passes": res.info["passes"]}
    print(f"[4/5] lifted {len(scene.gaussians)} Gaussians over {len(scene.cameras)} views")

    best = lifted["rh3dgs (VCD + robust Frechet)"]
    field = best.field()
    scene_dir = save_scene(out / "scene", scene.gaussians, field, scene.cameras,
                           image_paths=[data / "images" / f"{n}.png" for n in names],
                           teacher={"name": "precomputed", "features_dir": str(Path(sim.features_dir).resolve())},
                           info={k: v for k, v in best.info.items()})
    api_scene = load(scene_dir)
    qdir = out / "queries"
    queries = [c for c in classes if c != "floor"]
    shown = [0, len(names) // 3, 2 * len(names) // 3]
    for i in shown:
        rel = api_scene.render_relevancy(i, queries)
        rgb = api_scene.render(i)
        for q, r in zip(queries, rel):
            atomic_save_png(qdir / f"{names[i]}_{q.replace(' ', '_')}.png", highlight(rgb, r, threshold=THRESHOLD))
        atomic_save_png(qdir / "sheets" / f"{names[i]}.png", result_sheet(rgb, rel[:4], queries[:4], THRESHOLD,
                                                                      title=f"{names[i]}: text queries"))
    sel_lines = []
    for q in queries[:3]:
        sel = api_scene.select(q)
        k = classes.index(q)
        gt = scene.class_ids == k
        inter = int((sel & gt).sum())
        api_scene.export_ply(qdir / f"{q.replace(' ', '_')}.ply", mask=sel)
        sel_lines.append(f"  '{q}': selected {int(sel.sum())} Gaussians, {inter}/{int(gt.sum())} of the object's "
                         f"(IoU {inter / max(1, int((sel | gt).sum())):.3f}) -> {q.replace(' ', '_')}.ply")
    atomic_save_json(out / "metrics.json", {"results": results, "classes": classes, "seconds": time.time() - t0})
    print(f"[5/5] relevancy PNGs and selections -> {qdir}; semantic scene -> {scene_dir}")
    lines = ["", "| lift | 3D mIoU | 2D mIoU | passes | seconds |", "|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {100 * r['miou_3d']:.2f} | {100 * r['miou_2d']:.2f} | {r['passes']} | {r['seconds']:.1f} |")
    lines.append(f"3D selections (threshold {THRESHOLD}):")
    lines += sel_lines
    lines.append(f"metrics: {out / 'metrics.json'}")
    return "\n".join(lines)
