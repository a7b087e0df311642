"""End to end in Python: synthetic scene -> simulated teacher -> training-free lift -> text queries.

    python examples/quickstart.py [OUTPUT_DIR]
"""
import sys
from pathlib import Path

import torch

import rh3dgs
from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
from rh3dgs.data.teacher_sim import simulate_teacher
from rh3dgs.lifting import LiftConfig, lift
from rh3dgs.teachers import PrecomputedTeacher
from rh3dgs.viz import overlay_heatmap
from rh3dgs.io.atomic import atomic_save_png


def main(out: Path, size: int = 96, views: int = 8) -> None:
    synthetic = make_scene(SceneConfig(num_views=views, image_size=size))
    write_dataset(synthetic, out / "data")                        # images, transforms.json, masks, scene.ply
    sim = simulate_teacher(out / "data")                            # features/<stem>.npy + text_embeddings.npz
    teacher = PrecomputedTeacher(features_dir=sim.features_dir)

    res = lift(synthetic.gaussians, synthetic.cameras,
               lambda i: teacher.load_feature_map(synthetic.cameras.names[i]), LiftConfig(method="robust"))
    rh3dgs.save_scene(out / "scene", synthetic.gaussians, res.field(),
                      synthetic.cameras, teacher={"name": "precomputed", "features_dir": str(sim.features_dir.resolve())})

    scene = rh3dgs.load(out / "scene")
    rel = scene.render_relevancy(0, ["red ball", "blue box"])      # [2, H, W]
    rgb = scene.render(0)                                           # [H, W, 3]
    atomic_save_png(out / "red_ball_view0.png", overlay_heatmap(rgb, rel[0], threshold=0.5))
    sel = scene.select("red ball", threshold=0.5)                   # bool [N]
    scene.export_ply(out / "red_ball.ply", mask=sel)
    gt = synthetic.class_ids == synthetic.class_names.index("red ball")
    iou = (sel & gt).sum().item() / max(1, (sel | gt).sum().item())
    print(f"lifted {len(scene)} Gaussians in {res.info['seconds']:.1f} s; 'red ball' selects {int(sel.sum())} "
          f"Gaussians (IoU with ground truth {iou:.2f}); relevancy max {float(rel.max()):.2f}; outputs in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("outputs/quickstart"))
