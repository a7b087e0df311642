"""Evaluation of semantic scene folders against ground truth, the synthetic suite and `rh3dgs eval`."""
import json

import numpy as np
import pytest
import torch

from rh3dgs.errors import ConfigError, InputFileError
from rh3dgs.eval.suite import SUITE_ROWS, PeakMemory, SuiteConfig, evaluate_scene, run_suite


def _eval(argv):
    """``rh3dgs eval ARGV...`` parsed by the package's command line: the :class:`Eval` command."""
    from rh3dgs.cli import parse

    return parse(["eval", *argv]).command


@pytest.fixture(scope="module")
def quick_suite(tmp_path_factory):
    """`rh3dgs eval --suite synthetic --quick` (the whole ablation table on one small scene)."""
    out = tmp_path_factory.mktemp("suite") / "out"
    md = out.parent / "results_doc.md"
    assert _eval(["--suite", "synthetic", "--quick", "--output", str(out), "--markdown", str(md)]).main() == 0
    return out, md


def test_quick_suite_writes_table(quick_suite):
    out, md = quick_suite
    s = json.loads((out / "results.json").read_text())
    assert s["complete"] and s["rows"] == [r[0] for r in SUITE_ROWS]
    cfg = SuiteConfig.quick()
    assert len(s["runs"]) == len(SUITE_ROWS) * len(cfg.layouts) * len(cfg.teachers)
    for r in s["runs"]:
        for k in ("miou", "mbiou", "miou_3d", "miou_3d_nofill", "lerf_miou", "accuracy"):
            assert 0.0 <= r[k] <= 1.0, (r["row"], k, r[k])
        assert r["seconds"] > 0 and r["peak_bytes"] >= 0 and len(r["class_iou"]) == len(r["classes"])
    # every method must be far above chance (8 classes) on the quick scene
    assert min(r["miou"] for r in s["runs"]) > 0.3
    # the paired comparisons are computed from the runs: re-derive one by hand
    comp = next(c for c in s["comparisons"] if c["label"] == "trained vs the lift it starts from")
    by = {(r["row"], r["teacher"]): r["miou"] for r in s["runs"]}
    diffs = [by[(comp["method"], t)] - by[(comp["baseline"], t)] for t in cfg.teachers]
    assert comp["overall"]["miou"]["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert comp["overall"]["miou"]["n"] == len(cfg.teachers)
    assert [a["target"] for a in s["acceptance"]]
    text = (out / "results.md").read_text()
    assert "## Paired comparisons" in text and "| comparison | mIoU | mBIoU | 3D mIoU |" in text
    assert "held-out" in text
    for png in ("paired_differences.png", "worst_classes.png", "qualitative_synthetic00_tabletop_clip-moderate.png"):
        assert (out / png).is_file() and (out / png).stat().st_size > 10_000, png
        assert f"](out/{png})" in md.read_text()
    # wall time: a few minutes on an idle 2-core machine (not asserted: shared CI machines vary 10x)


def test_eval_scene_cli_and_perfect_field(quick_suite, tmp_path):
    from rh3dgs.api import load
    from rh3dgs.field import SemanticField
    from rh3dgs.io.scene import save_scene

    out, _ = quick_suite
    data = out / "work" / "tabletop_seed0_10v" / "data"
    row = out / "work" / "tabletop_seed0_10v" / "clip-moderate" / "robust_lift_plus_VCD"
    assert _eval([str(row), "--data", str(data), "--output", str(tmp_path / "ev")]).main() == 0
    ev = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert 0.3 < ev["miou"] <= 1.0 and "miou_3d" in ev and "miou_3d_nofill" in ev
    # an oracle field (latent = one-hot class, decoder = text embeddings) scores ~perfectly
    sc = load(row)
    classes = (data / "classes.txt").read_text().split("\n")[:-1]
    text = sc.encode(classes)  # [K, D]
    gt3d = torch.from_numpy(np.asarray(__import__("rh3dgs").load_ply(data / "scene.ply").extra["class_id"])).long()
    lat = torch.nn.functional.one_hot(gt3d, len(classes)).float()
    table = {n: text[k] for k, n in enumerate(classes)}
    table.update({n: v for n, v in zip(sc.negatives, sc._negatives(None))})
    oracle = save_scene(tmp_path / "oracle", sc.gaussians, SemanticField(lat, text.T.contiguous()), sc.cameras,
                        text_embeddings=table)
    res = evaluate_scene(oracle, data)
    assert res["miou_3d"] == pytest.approx(1.0)
    assert res["miou"] > 0.9 and res["accuracy"] > 0.95 and res["mbiou"] > 0.8
    # held-out views only: the scene folder records them
    held = json.loads((row / "rh3dgs.json").read_text())["info"]["heldout_views"]
    res_h = evaluate_scene(oracle, data, views=held)
    assert res_h["num_views"] == len(held) == SuiteConfig.quick().heldout_views


def test_eval_errors(tmp_path):
    with pytest.raises(ConfigError, match="--suite"):
        _eval([]).main()
    with pytest.raises(ConfigError, match="not both"):
        _eval(["x", "--suite", "synthetic"]).main()
    (tmp_path / "data").mkdir()
    with pytest.raises(InputFileError, match="classes.txt"):
        from rh3dgs.eval.suite import read_gt_dataset

        read_gt_dataset(tmp_path / "data")
    with pytest.raises(ConfigError, match="unknown suite rows"):
        run_suite(tmp_path / "o", SuiteConfig.quick(rows=("nope",)))
    with pytest.raises(ConfigError, match="unknown suite teachers"):
        SuiteConfig(teachers=("nope",))


def test_peak_memory_sees_an_allocation():
    with PeakMemory() as pm:
        x = torch.ones(64, 1024, 1024)  # 256 MiB
        x += 1
        del x
    assert pm.peak_bytes > 100 * 2 ** 20


@pytest.mark.slow
def test_a_part_runs_its_pairs_and_resumes(tmp_path):
    """A pair of the development part (a mask teacher at one granularity per view, 6 training views) through the
    named steps; a rerun reads every record back, a changed setting recomputes only the rows it changes."""
    from rh3dgs.eval.families import part_pairs
    from rh3dgs.eval.rows import LIFT_OURS, TRAINED_ISSUE16

    pair = part_pairs("dev")[32]
    assert (pair.teacher, pair.views) == ("sam-multilevel", 6)
    cfg = SuiteConfig(part="dev", pairs=(32,), image_size=32, gaussians_per_unit_area=300.0, heldout_views=2,
                      distill_steps=6, rows=(LIFT_OURS, TRAINED_ISSUE16), qualitative=None, save_scenes="none")
    s1 = run_suite(tmp_path / "o", cfg, progress=False)
    assert s1["complete"] and [r["row"] for r in s1["runs"]] == [LIFT_OURS, TRAINED_ISSUE16]
    assert {(r["scene"], r["teacher"], r["views"], r["seed"]) for r in s1["runs"]} == {
        (pair.scene, pair.teacher, 6, pair.seed)}
    tr = s1["transitions"][0]["data"]
    assert tr["pixels"] > 0 and 0 <= tr["fixed"] + tr["broken"] <= tr["pixels"]
    records = sorted((tmp_path / "o" / "runs").rglob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in records]
    s2 = run_suite(tmp_path / "o", cfg, progress=False)
    assert [p.stat().st_mtime_ns for p in records] == stamps and s2["runs"] == s1["runs"]
    s3 = run_suite(tmp_path / "o", SuiteConfig(**{**cfg.__dict__, "distill_steps": 7}), progress=False)
    assert [r["seconds"] for r in s3["runs"]][0] == s1["runs"][0]["seconds"]  # the lift is read back
    assert s3["runs"][1]["fingerprint"] != s1["runs"][1]["fingerprint"]
    assert "## Where training moves the held-out pixels" in (tmp_path / "o" / "results.md").read_text()


def test_markdown_report_keeps_its_hand_written_part(tmp_path):
    from rh3dgs.eval.report import HAND_WRITTEN, keep_hand_written

    md = tmp_path / "results.md"
    assert keep_hand_written(md, "# tables\n") == "# tables\n"  # no file yet
    md.write_text("# old tables\n| a |\n")
    assert keep_hand_written(md, "# new tables\n") == "# new tables\n"  # nothing written by hand
    md.write_text(f"# old tables\n| a |\n\n{HAND_WRITTEN}\n\n## Development draws\n- a finding\n")
    kept = keep_hand_written(md, "# new tables\n| b |\n")
    assert kept == f"# new tables\n| b |\n\n{HAND_WRITTEN}\n\n## Development draws\n- a finding\n"
    assert "old tables" not in kept


def test_combine_reports_the_parts_and_their_reconstructed_geometry_runs(tmp_path):
    """``--combine DEV TEST DEV_RECON TEST_RECON``: four part sections and two development-to-test tables; folders in
    the wrong order (a part, or the geometry, other than the slot says) are refused naming the file."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs" / "results"
    folders = []
    for name, part, noise in [("d", "dev", 0.0), ("t", "test", 0.0), ("dr", "dev", 1.0), ("tr", "test", 1.0)]:
        s = json.loads((docs / part / "results.json").read_text())
        s["config"]["geometry_noise"], s["pngs"] = noise, []
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(s))
        (tmp_path / name / "results.md").write_text("")
        folders.append(str(tmp_path / name))
    md = tmp_path / "results.md"
    assert _eval(["--suite", "synthetic", "--combine", *folders, "--markdown", str(md)]).main() == 0
    text = md.read_text()
    heads = [ln for ln in text.splitlines() if ln.startswith("# ") or ln.startswith("## Development to test")]
    assert heads[1:] == ["## Development to test (mean paired differences; test minus development in brackets)",
                         "## Development to test, reconstructed geometry (mean paired differences; test minus "
                         "development in brackets)", "# Development part", "# Test part",
                         "# Development part, reconstructed geometry", "# Test part, reconstructed geometry"]
    assert "`--geometry-noise 1`" in text and "| trained vs the lift it starts from | +5.30 / +5.09 (-0.21) |" in text
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["dev", "dev-recon", "test", "test-recon"]
    with pytest.raises(ConfigError, match="dr/results.json is the dev part with --geometry-noise 1; expected the test"):
        _eval(["--suite", "synthetic", "--combine", folders[0], folders[2], "--markdown", str(md),
               "--overwrite"]).main()
