"""Reports of the synthetic suite: results.json, results.md (tables, paired comparisons, acceptance
checks, worst classes), matplotlib plots and qualitative sheets.

Everything here is computed from the run records of :func:`rh3dgs.eval.suite.run_suite`; nothing
is typed by hand (``docs/results.md`` is this module's output).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .stats import PairedDifference, paired_difference

__all__ = ["write_summary", "write_parts_markdown", "load_summary", "suite_markdown", "parts_markdown", "keep_hand_written",
           "HAND_WRITTEN", "comparisons", "acceptance", "transitions",
           "qualitative_sheet", "label_colors"]

PathLike = Union[str, Path]
METRICS = (("miou", "mIoU"), ("mbiou", "mBIoU"), ("miou_3d", "3D mIoU"))
#: The line of a ``--markdown`` report (docs/results.md) from which on it is written by hand (the development
#: draws the defaults were chosen on): a new report keeps that part.
HAND_WRITTEN = "<!-- written by hand from here on: rh3dgs eval --markdown keeps this part -->"


def label_colors(K: int) -> np.ndarray:
    """[K, 3] uint8 class colours (a fixed palette, repeated)."""
    base = np.array([[140, 130, 115], [216, 31, 26], [31, 64, 216], [38, 178, 51], [235, 209, 26], [200, 200, 196],
                     [140, 51, 178], [90, 90, 90], [255, 128, 0], [0, 200, 200]], dtype=np.uint8)
    reps = int(math.ceil(K / len(base)))
    return np.concatenate([base] * reps)[:K]


def _label_image(lab: np.ndarray, K: int) -> np.ndarray:
    col = label_colors(K)
    out = np.full(lab.shape + (3,), 255, np.uint8)
    ok = (lab >= 0) & (lab < K)
    out[ok] = col[lab[ok]]
    return out


def _pair_key(r: dict) -> str:
    return str(r["pair"])


def _kind(teacher: str) -> str:
    from .families import TEACHER_FAMILIES

    f = TEACHER_FAMILIES.get(teacher)
    return f.kind if f is not None else teacher.split("-")[0]


#: The families a comparison is broken down by: (record key, heading).
GROUPS: Tuple[Tuple[str, str], ...] = (("teacher", "teacher family"), ("scene", "scene family"),
                                       ("views", "training views"))


def paired(runs: List[dict], method: str, baseline: str, metric: str,
           where=lambda r: True, metric_base: Optional[str] = None) -> PairedDifference:
    """Paired difference method - baseline of ``metric`` over the pairs both were run on (``where`` filters)."""
    a = {_pair_key(r): r.get(metric, math.nan) for r in runs if r["row"] == method and where(r)}
    b = {_pair_key(r): r.get(metric_base or metric, math.nan) for r in runs if r["row"] == baseline and where(r)}
    keys = sorted(set(a) & set(b))
    return paired_difference([_num(a[k]) for k in keys], [_num(b[k]) for k in keys])


def _num(v) -> float:
    return math.nan if v is None else float(v)


#: The bound of the 3D filling: every filled Gaussian given its true class (read from the ground truth by the
#: evaluation only).
FILL_CEILING = "3D filling's ceiling (every filled Gaussian given its true class)"


def comparisons(runs: List[dict], rows: Sequence[str]) -> List[dict]:
    """Every comparison of :data:`rh3dgs.eval.rows.COMPARISONS` whose rows ran, plus the 3D filling, as dicts
    ``{label, method, baseline, overall: {metric: PairedDifference}, by_kind: {kind: {metric: ...}},
    by: {group: {value: {metric: ...}}}}`` for the groups of :data:`GROUPS` (``by["teacher"]`` also as
    ``by_teacher``)."""
    from .rows import COMPARISONS, LIFT_OURS

    kinds = sorted({_kind(r["teacher"]) for r in runs})
    out = []
    todo = [(lab, m, b, None) for lab, m, b in COMPARISONS if m in rows and b in rows]
    if LIFT_OURS in rows:
        todo.append(("3D filling in the lift (all Gaussians of opacity > 0.1)", LIFT_OURS, LIFT_OURS, "fill"))
        todo.append((FILL_CEILING, LIFT_OURS, LIFT_OURS, "ceiling"))
    for label, m, b, special in todo:
        metrics = ("miou_3d",) if special else [k for k, _ in METRICS]

        def diff(key, where=lambda r: True):
            if special:
                key = "miou_3d" if special == "fill" else "miou_3d_fill_ceiling"
                return paired(runs, m, b, key, where, metric_base="miou_3d_nofill")
            return paired(runs, m, b, key, where)

        by = {g: {v: {k: diff(k, lambda r, g=g, v=v: r[g] == v) for k in metrics}
                  for v in _values(runs, g)} for g, _ in GROUPS}
        out.append({
            "label": label, "method": m if special != "ceiling" else f"{m}, filled Gaussians given their true class",
            "baseline": b if not special else f"{b}, without filling",
            "overall": {k: diff(k) for k in metrics}, "by": by, "by_teacher": by["teacher"],
            "by_kind": {c: {k: diff(k, lambda r, c=c: _kind(r["teacher"]) == c) for k in metrics} for c in kinds},
        })
    return out


def _values(runs: List[dict], group: str) -> List:
    """The values of ``group`` in the runs, in first-seen order (views sorted)."""
    seen: List = []
    for r in runs:
        if r.get(group) not in seen:
            seen.append(r.get(group))
    return sorted(seen) if group == "views" else seen


def _find(comps: List[dict], label: str) -> Optional[dict]:
    return next((c for c in comps if c["label"] == label), None)


def acceptance(comps: List[dict], part: Optional[str] = None) -> List[Tuple[str, Optional[bool], str]]:
    """The targets of the method issues, checked on the paired results: (target, met (None = not run), evidence).
    A part of the widened suite (``part``) is checked against issue 46's targets, the old design against issue 16's."""
    if part is not None:
        return _acceptance_issue46(comps)
    checks: List[Tuple[str, Optional[bool], str]] = []

    def pt(d: PairedDifference) -> str:
        return d.fmt()

    c = _find(comps, "trained vs the lift it starts from")
    if c:
        o = c["overall"]
        ok = o["miou"].mean >= 0.02 and o["mbiou"].mean >= 0.03 and o["miou_3d"].mean >= 0.0
        checks.append(("trained Rh-3DGS >= robust lift + 2 mIoU, + 3 mBIoU, 3D mIoU >= the lift's", ok,
                       f"mIoU {pt(o['miou'])}, mBIoU {pt(o['mbiou'])}, 3D {pt(o['miou_3d'])}"))
    c = _find(comps, "robust lift + VCD vs Euclidean lift")
    if c:
        kinds = c["by_kind"]
        ok_k = all(v["miou"].mean >= 0.02 and v["mbiou"].mean >= 0.02 for v in kinds.values())
        worst = min(min(v["miou"].mean, v["mbiou"].mean) for v in c["by_teacher"].values())
        ev = "; ".join(f"{k}: mIoU {pt(v['miou'])}, mBIoU {pt(v['mbiou'])}" for k, v in kinds.items())
        checks.append(("robust lift + VCD >= Euclidean lift + 2 mIoU and + 2 mBIoU on both teacher kinds", ok_k, ev))
        checks.append(("... and never below it by more than 0.5 on any teacher preset", worst >= -0.005,
                       f"worst preset mean {100 * worst:+.2f}"))
    for part in ("VCD", "VFM", "LIC"):
        c = _find(comps, f"{part} in training")
        if not c:
            continue
        o = c["overall"]
        gain = o["miou"].mean > 0 or o["mbiou"].mean > 0
        worst = min(v["miou"].mean for v in c["by_teacher"].values())
        checks.append((f"{part} (in training): positive mean paired gain in mIoU or mBIoU, never costs > 0.5 mIoU",
                       gain and worst >= -0.005,
                       f"mIoU {pt(o['miou'])}, mBIoU {pt(o['mbiou'])}; worst preset mIoU {100 * worst:+.2f}"))
    c = _find(comps, "3D filling in the lift (all Gaussians of opacity > 0.1)")
    if c:
        d = c["overall"]["miou_3d"]
        top = _find(comps, FILL_CEILING)
        bound = f" (a perfect filling: {pt(top['overall']['miou_3d'])})" if top else ""
        checks.append(("3D mIoU over all opacity > 0.1 Gaussians >= the same without filling + 5", d.mean >= 0.05,
                       f"{pt(d)}{bound}"))
    return checks


def _acceptance_issue46(comps: List[dict]) -> List[Tuple[str, Optional[bool], str]]:
    """Issue 46 on a part: trained >= lift + 1.5 mIoU and + 2 mBIoU on average, never below the lift by more than
    0.3 mIoU on any teacher family, 3D mIoU >= the lift's + 5."""
    c = _find(comps, "trained vs the lift it starts from")
    if not c:
        return []
    o = c["overall"]
    worst_t, worst = min(((t, v["miou"].mean) for t, v in c["by"]["teacher"].items()), key=lambda x: x[1])
    return [
        ("trained >= lift + 1.5 mIoU and + 2 mBIoU (mean over the pairs)",
         o["miou"].mean >= 0.015 and o["mbiou"].mean >= 0.02, f"mIoU {o['miou'].fmt()}, mBIoU {o['mbiou'].fmt()}"),
        ("... never below the lift by more than 0.3 mIoU on any teacher family", worst >= -0.003,
         f"worst teacher family {worst_t}: {100 * worst:+.2f}"),
        ("3D mIoU >= the lift's + 5", o["miou_3d"].mean >= 0.05, f"3D {o['miou_3d'].fmt()}"),
    ]


def transitions(runs: List[dict], records, method: str, baseline: str) -> Dict[str, object]:
    """Where ``method`` moves held-out pixels relative to ``baseline``, from the runs' saved argmax maps: per
    labelled pixel, *fixed* (baseline wrong, method right) or *broken* (baseline right, method wrong). Returns
    ``{"pixels", "fixed", "broken"`` (counts), ``"boundary"``: the same three within 2 px of another label (or of
    the background), ``"by_class"``: {(scene, class): [pixels, fixed, broken]}, ``"by_teacher"``: {teacher:
    [pixels, fixed, broken]}, ``"into"``: {"neighbour" | "other": broken pixels that took the class of a label
    within 4 px / another class}}. Pairs without saved maps are skipped."""
    from scipy.ndimage import grey_dilation, grey_erosion, maximum_filter

    base = {_pair_key(r): r for r in runs if r["row"] == baseline}
    tot = {"pixels": 0, "fixed": 0, "broken": 0}
    bnd = dict(tot)
    by_class: Dict[Tuple[str, str], List[int]] = {}
    by_teacher: Dict[str, List[int]] = {}
    into = {"neighbour": 0, "other": 0}
    for r in runs:
        if r["row"] != method or _pair_key(r) not in base:
            continue
        got = records.transition_inputs(r, method, baseline)
        if got is None:
            continue
        pm, pb, gt = got
        lab = gt >= 0
        fixed, broken = lab & (pb != gt) & (pm == gt), lab & (pb == gt) & (pm != gt)
        g = np.where(lab, gt, -1)
        size = (1, 5, 5)
        edge = (grey_dilation(g, size=size) != grey_erosion(g, size=size)) & lab
        near = np.zeros_like(broken)
        for k in np.unique(pm[broken]):
            near |= broken & (pm == k) & maximum_filter(gt == k, size=(1, 9, 9))
        into["neighbour"] += int(near.sum())
        into["other"] += int((broken & ~near).sum())
        for d, m in ((tot, lab), (bnd, edge)):
            d["pixels"] += int(m.sum())
            d["fixed"] += int((fixed & m).sum())
            d["broken"] += int((broken & m).sum())
        bt = by_teacher.setdefault(r["teacher"], [0, 0, 0])
        for k, name in enumerate(r["classes"]):
            m = gt == k
            if not m.any():
                continue
            c = by_class.setdefault((r["scene"], name), [0, 0, 0])
            for acc in (c,):
                acc[0] += int(m.sum())
                acc[1] += int((fixed & m).sum())
                acc[2] += int((broken & m).sum())
        bt[0] += int(lab.sum())
        bt[1] += int(fixed.sum())
        bt[2] += int(broken.sum())
    return {**tot, "boundary": bnd, "by_class": by_class, "by_teacher": by_teacher, "into": into}


def transitions_markdown(tr: Dict[str, object], method: str, baseline: str, n: int = 12) -> List[str]:
    """The transitions of :func:`transitions` as Markdown: totals, boundary share, per teacher, the classes
    training breaks most (net)."""
    if not tr or not tr["pixels"]:
        return []
    P = tr["pixels"]
    b = tr["boundary"]
    into = tr["into"]
    lines = [f"Held-out pixels {method} moves, against {baseline} (percent of the labelled pixels): fixed "
             f"{100 * tr['fixed'] / P:.2f}, broken {100 * tr['broken'] / P:.2f}, net {100 * (tr['fixed'] - tr['broken']) / P:+.2f}; "
             f"within 2 px of a label boundary ({100 * b['pixels'] / P:.1f} % of the pixels): fixed "
             f"{100 * b['fixed'] / P:.2f}, broken {100 * b['broken'] / P:.2f}; of the broken pixels "
             f"{100 * into['neighbour'] / max(1, tr['broken']):.0f} % take the class of a label within 4 px.", "",
             "| teacher family | pixels | fixed % | broken % | net % |", "| --- | --- | --- | --- | --- |"]
    for t, (p, f, br) in tr["by_teacher"].items():
        lines.append(f"| {t} | {p} | {100 * f / p:.2f} | {100 * br / p:.2f} | {100 * (f - br) / p:+.2f} |")
    worst = sorted(tr["by_class"].items(), key=lambda kv: (kv[1][1] - kv[1][2]) / max(1, kv[1][0]))[:n]
    lines += ["", "The classes it breaks most (net share of the class's held-out pixels):", "",
              "| scene family | class | pixels | fixed % | broken % | net % |", "| --- | --- | --- | --- | --- | --- |"]
    for (scene, cls), (p, f, br) in worst:
        lines.append(f"| {scene} | {cls} | {p} | {100 * f / p:.1f} | {100 * br / p:.1f} | {100 * (f - br) / p:+.1f} |")
    return lines + [""]


def _fmt_mean_std(vals: List[float], scale: float = 100.0, digits: int = 2) -> str:
    v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return "-"
    m = scale * float(np.mean(v))
    return f"{m:.{digits}f}" if len(v) == 1 else f"{m:.{digits}f} ± {scale * float(np.std(v)):.{digits}f}"


def worst_classes(runs: List[dict], rows: Sequence[str], n: int = 10) -> List[dict]:
    """The (scene, class) pairs with the lowest IoU of the first of ``rows``, with every row's IoU."""
    table: Dict[Tuple[str, str], Dict[str, List[float]]] = {}
    for r in runs:
        if r["row"] not in rows:
            continue
        for name, v in zip(r["classes"], r["class_iou"]):
            if v is not None and not math.isnan(v):
                table.setdefault((r["scene"], name), {}).setdefault(r["row"], []).append(v)
    items = [{"scene": k[0], "class": k[1], **{row: float(np.mean(v[row])) if row in v else math.nan for row in rows}}
             for k, v in table.items()]
    items.sort(key=lambda it: it.get(rows[0], math.nan))
    return items[:n]


def _reconstruction(noise: float) -> str:
    """What ``--geometry-noise`` gives the methods (``rh3dgs.eval.suite.reconstruction``), in words."""
    return (f"the methods get a stand-in for a reconstruction, the scene's Gaussians with every mean moved by "
            f"N(0, ({noise:g} disk widths)^2) per axis and every opacity scaled by U(0.6, 1); images, masks and "
            "teachers come from the true scene")


def _design_line(summary: Dict[str, object]) -> str:
    cfg, runs = summary["config"], summary["runs"]
    n_pairs = len({_pair_key(r) for r in runs})
    noise = float(cfg.get("geometry_noise") or 0)
    head = (f"Generated by `rh3dgs eval --suite synthetic{' --quick' if summary.get('quick') else ''}"
            f"{' --part ' + cfg['part'] if cfg.get('part') else ''}{f' --geometry-noise {noise:g}' if noise else ''}` "
            f"(its rows: {sum(r.get('seconds', 0.0) for r in runs):.0f} s on {summary['device']}, "
            f"{summary['threads']} torch threads). ")
    geometry = f"{_reconstruction(noise)}; " if noise else ""
    if cfg.get("part"):
        return head + (f"The {cfg['part']} part of the widened suite (`rh3dgs/eval/families.py`, `docs/suite.md`): "
                       f"{n_pairs} pairs of {len(_values(runs, 'scene'))} scene families x "
                       f"{len(_values(runs, 'teacher'))} teacher families, {_values(runs, 'views')} training views; "
                       f"{cfg['image_size']}x{cfg['image_size']} px, scored on {cfg['heldout_views']} **held-out** views; "
                       f"{geometry}trained rows: {cfg['distill_steps']} steps on fixed geometry from the robust lift. "
                       "Values in percent.")
    return head + (f"{len(cfg['layouts'])} scene layouts {list(cfg['layouts'])} x {len(cfg['teachers'])} simulated "
                   f"teachers {list(cfg['teachers'])} = {n_pairs} (scene, teacher draw) pairs, seed {cfg['seed']}; "
                   f"{cfg['image_size']}x{cfg['image_size']} px, {cfg['num_views']} training views, scored on "
                   f"{cfg['heldout_views']} **held-out** views; trained rows: {cfg['distill_steps']} steps on fixed "
                   "geometry from the robust lift. Values in percent.")


def _comparison_tables(comps: List[dict], runs: List[dict]) -> List[str]:
    lines = ["## Paired comparisons (method minus baseline on the same pairs: mean [95 % interval])", "",
             "| comparison | mIoU | mBIoU | 3D mIoU |", "| --- | --- | --- | --- |"]
    for c in comps:
        o = c["overall"]
        lines.append(f"| {c['label']} ({c['method']} - {c['baseline']}) | "
                     + " | ".join(o[k].fmt() if k in o else "-" for k, _ in METRICS) + " |")
    for group, heading in GROUPS:
        vals = _values(runs, group)
        if len(vals) < 2:
            continue
        lines += ["", f"Per {heading} (mean paired difference in mIoU / mBIoU / 3D mIoU):", "",
                  f"| comparison | " + " | ".join(str(v) for v in vals) + " |", "| --- |" + " --- |" * len(vals)]
        for c in comps:
            cells = []
            for v in vals:
                d = c["by"][group].get(v, {})
                cells.append(" / ".join(f"{100 * d[k].mean:+.2f}" for k, _ in METRICS if k in d))
            lines.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    return lines


def _rows_table(rows: Sequence[str], runs: List[dict]) -> List[str]:
    lines = ["## All rows (mean ± std over the pairs; the spread is mostly between scenes)", "",
             "| row | mIoU | mBIoU | 3D mIoU | 3D mIoU without filling | LERF-OVS mIoU | time (s) | peak mem (MB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in rows:
        rs = [r for r in runs if r["row"] == name]
        lines.append("| " + " | ".join([
            name, _fmt_mean_std([r["miou"] for r in rs]), _fmt_mean_std([r["mbiou"] for r in rs]),
            _fmt_mean_std([r["miou_3d"] for r in rs]), _fmt_mean_std([r["miou_3d_nofill"] for r in rs]),
            _fmt_mean_std([r["lerf_miou"] for r in rs]), _fmt_mean_std([r["seconds"] for r in rs], 1.0, 1),
            _fmt_mean_std([r["peak_bytes"] / 2 ** 20 for r in rs], 1.0, 0)]) + " |")
    return lines


def suite_markdown(summary: Dict[str, object], image_prefix: str = "") -> str:
    from .rows import EUCLIDEAN_LIFT, LIFT_OURS, TEACHER_PRESETS, TRAINED_OURS
    from .scoring import __doc__ as scoring_doc

    cfg = summary["config"]
    rows, runs = summary["rows"], summary["runs"]
    comps = summary["comparisons_obj"]
    lines = ["# Ground-truth suite on synthetic scenes", "",
             "What this page is for: the method's numbers, every row and paired comparison of the synthetic suite "
             "scored on held-out views against ground truth; a `--markdown` report ends with the development draws "
             "the defaults were chosen on.", "", _design_line(summary), "",
             *([] if summary.get("complete", True) else
               [f"**PARTIAL: {summary['runs_done']} of {summary['runs_total']} runs finished when this was written.**",
                ""]),
             *_comparison_tables(comps, runs), "", "## Targets of the method issue (checked on the numbers above)", ""]
    for target, ok, ev in acceptance(comps, cfg.get("part")):
        lines.append(f"- [{'x' if ok else ' '}] {target}: {ev}")
    lines += ["", *_rows_table(rows, runs)]
    if summary.get("transitions"):
        lines += ["", "## Where training moves the held-out pixels", ""]
        for tr in summary["transitions"]:
            lines += transitions_markdown(tr["data"], tr["method"], tr["baseline"])
    show = [r for r in (EUCLIDEAN_LIFT, LIFT_OURS, TRAINED_OURS) if r in rows]
    if show:
        lines += ["", "## Worst classes (held-out IoU per (scene family, class), mean over its pairs)", "",
                  "| scene | class | " + " | ".join(show) + " |", "| --- | --- |" + " --- |" * len(show)]
        for it in worst_classes(runs, [show[-1], *show[:-1]]):
            lines.append(f"| {it['scene']} | {it['class']} | " + " | ".join(
                "-" if math.isnan(it[r]) else f"{100 * it[r]:.1f}" for r in show) + " |")
    lines += ["", "## Plots and qualitative sheets", ""]
    for p in summary.get("pngs", []):
        lines.append(f"![{Path(p).stem}]({image_prefix}{p})")
    lines += ["", "## Teachers", ""]
    presets = {**TEACHER_PRESETS, **{k: tuple(v) for k, v in (cfg.get("extra_teachers") or {}).items()}}
    for t in _values(runs, "teacher"):
        kind, over = presets[t]
        lines.append(f"- `{t}`: {'TeacherSimConfig' if kind == 'clip' else 'MaskTeacherSimConfig'} defaults"
                     f"{' + ' + str(over) if over else ''}")
    lines += ["", "## Protocol", "", (scoring_doc or "").split("Protocols", 1)[-1].strip(), ""]
    return "\n".join(lines)


#: the parts ``--combine`` reports, in order: the suite's two parts, then both with a reconstruction's Gaussians
PART_NAMES = ("dev", "test", "dev-recon", "test-recon")
PART_TITLES = {"dev": "Development part", "test": "Test part",
               "dev-recon": "Development part, reconstructed geometry", "test-recon": "Test part, reconstructed geometry"}


def parts_markdown(parts: Dict[str, Dict[str, object]], image_prefixes: Optional[Dict[str, str]] = None) -> str:
    """``docs/results.md`` for the widened suite: the parts of :data:`PART_NAMES` present in ``parts`` (each as
    :func:`suite_markdown` gives it, headings one level down) and, first, the development-to-test difference of
    every comparison both ran, for the exact Gaussians and, when run, for the reconstruction."""
    lines = ["# Ground-truth suite on synthetic scenes: development and test parts", "",
             "The suite's families and split are `rh3dgs/eval/families.py` (`docs/suite.md`): method choices are made "
             "on the development part only; the test part is run once per candidate and reported as it comes out.", ""]
    if "dev" in parts and "test" in parts:
        lines += _dev_to_test(parts["dev"]["comparisons_obj"], parts["test"]["comparisons_obj"])
    if "dev-recon" in parts and "test-recon" in parts:
        noise = parts["test-recon"]["config"]["geometry_noise"]
        lines += _dev_to_test(parts["dev-recon"]["comparisons_obj"], parts["test-recon"]["comparisons_obj"],
                              ", reconstructed geometry",
                              f"The same pairs with `--geometry-noise {noise:g}`: {_reconstruction(noise)}.")
    for name in PART_NAMES:
        if name not in parts:
            continue
        body = suite_markdown(parts[name], (image_prefixes or {}).get(name, ""))
        lines += [f"# {PART_TITLES[name]}", ""]
        lines += ["#" + ln if ln.startswith("#") else ln for ln in body.split("\n")[1:]]
    return "\n".join(lines)


def _dev_to_test(dev: List[dict], test: List[dict], which: str = "", note: str = "") -> List[str]:
    lines = [f"## Development to test{which} (mean paired differences; test minus development in brackets)", "",
             *([note, ""] if note else []),
             "| comparison | mIoU dev / test | mBIoU dev / test | 3D mIoU dev / test |", "| --- | --- | --- | --- |"]
    for c in dev:
        t = _find(test, c["label"])
        if t is None:
            continue
        cells = []
        for k, _ in METRICS:
            if k not in c["overall"]:
                cells.append("-")
                continue
            a, b = 100 * c["overall"][k].mean, 100 * t["overall"][k].mean
            cells.append(f"{a:+.2f} / {b:+.2f} ({b - a:+.2f})")
        lines.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _plots(out: Path, comps: List[dict], runs: List[dict], rows: Sequence[str]) -> List[str]:
    """Paired differences with intervals, and per-class IoU of the worst classes (matplotlib PNGs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.atomic import atomic_write
    from .rows import EUCLIDEAN_LIFT, LIFT_OURS, TRAINED_OURS

    names = []
    if comps:
        fig, axes = plt.subplots(1, 3, figsize=(15, 0.5 * len(comps) + 1.8), sharey=True)
        for ax, (key, label) in zip(axes, METRICS):
            ys, ms, lo, hi = [], [], [], []
            for i, c in enumerate(comps):
                d = c["overall"].get(key)
                if d is None or d.n == 0:
                    continue
                ys.append(i)
                ms.append(100 * d.mean)
                lo.append(100 * (d.mean - d.lo) if d.n > 1 else 0.0)
                hi.append(100 * (d.hi - d.mean) if d.n > 1 else 0.0)
            ax.barh(ys, ms, xerr=[lo, hi], color=["#2a7" if m >= 0 else "#c44" for m in ms], capsize=3)
            ax.axvline(0, color="k", lw=0.8)
            ax.set_title(f"{label}: method - baseline (points, 95 % CI)")
            ax.set_yticks(range(len(comps)))
            ax.set_yticklabels([c["label"] for c in comps])
            ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        with atomic_write(out / "paired_differences.png", "wb") as f:
            fig.savefig(f, format="png", dpi=110)
        plt.close(fig)
        names.append("paired_differences.png")
    show = [r for r in (EUCLIDEAN_LIFT, LIFT_OURS, TRAINED_OURS) if r in rows]
    worst = worst_classes(runs, [show[-1], *show[:-1]], n=12) if show else []
    if worst:
        fig, ax = plt.subplots(figsize=(12, 4.5))
        x = np.arange(len(worst))
        wdt = 0.8 / len(show)
        for j, r in enumerate(show):
            ax.bar(x + (j - (len(show) - 1) / 2) * wdt, [100 * it[r] for it in worst], wdt, label=r)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{it['scene']}: {it['class']}" for it in worst], rotation=35, ha="right")
        ax.set_ylabel("held-out IoU (%)")
        ax.set_title("The worst classes of the trained field, per method")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        with atomic_write(out / "worst_classes.png", "wb") as f:
            fig.savefig(f, format="png", dpi=110)
        plt.close(fig)
        names.append("worst_classes.png")
    return names


def qualitative_sheet(path: Path, rgb: np.ndarray, gt: np.ndarray, rows: List[Tuple[str, np.ndarray, Optional[np.ndarray]]],
                      class_names: Sequence[str], title: str) -> str:
    """A titled sheet: RGB, ground truth (with a legend), then per method its argmax classes with the wrong
    pixels outlined and its held-out mIoU on this view, and the relevancy of the class it gets most wrong
    (with a colour bar). Returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..io.atomic import atomic_write
    from .metrics import iou

    K = len(class_names)
    fg = gt != 255
    # the class with the lowest mean IoU over the methods on this view: the most telling relevancy map
    present = [k for k in range(K) if (gt == k).any()]
    worst_k = min(present, key=lambda k: np.mean([iou(p == k, gt == k) for _, p, _ in rows])) if present else 0
    n = 2 + len(rows)
    cols = 4
    nrows = int(math.ceil(n / cols))
    fig, axes = plt.subplots(nrows * 2 if any(r[2] is not None for r in rows) else nrows, cols,
                             figsize=(3.2 * cols, 3.4 * nrows * (2 if any(r[2] is not None for r in rows) else 1)))
    axes = np.atleast_2d(axes)
    for ax in axes.ravel():
        ax.axis("off")
    flat = list(axes.ravel())
    flat[0].imshow(rgb)
    flat[0].set_title("RGB (held-out)")
    flat[1].imshow(_label_image(np.where(fg, gt, -1), K))
    flat[1].set_title("ground truth")
    flat[1].legend(handles=[Patch(color=label_colors(K)[k] / 255, label=class_names[k]) for k in present],
                   fontsize=6, loc="lower left", framealpha=0.7)
    for j, (name, pred, _) in enumerate(rows):
        ax = flat[2 + j]
        img = _label_image(pred, K)
        wrong = fg & (pred != gt)
        img[wrong] = (0.45 * img[wrong] + 0.55 * 255).astype(np.uint8)  # wrong pixels washed out ...
        ax.imshow(img)
        ax.contour(wrong.astype(float), levels=[0.5], colors="k", linewidths=0.6)  # ... and outlined
        m = np.mean([iou(pred == k, gt == k) for k in present]) if present else math.nan
        ax.set_title(f"{name[:34]}\nmIoU {100 * m:.1f} on this view", fontsize=8)
    base = 2 + len(rows)
    base = int(math.ceil(base / cols)) * cols
    im = None
    for j, (name, _, rel) in enumerate(rows):
        if rel is None or base + j >= len(flat):
            continue
        ax = flat[base + j]
        im = ax.imshow(rel[worst_k], vmin=0, vmax=1, cmap="viridis")
        ax.contour((gt == worst_k).astype(float), levels=[0.5], colors="w", linewidths=0.8)
        ax.set_title(f"relevancy '{class_names[worst_k]}'\n{name[:34]}", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=[a for a in flat[base:] if a.images], fraction=0.02, pad=0.01, label="LERF relevancy")
    fig.suptitle(title + f"  (white outline: ground truth of '{class_names[worst_k]}')", fontsize=10)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return path.name


def _jsonable(obj):
    if isinstance(obj, PairedDifference):
        return obj.as_dict()
    if isinstance(obj, dict):
        return {("|".join(k) if isinstance(k, tuple) else k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def keep_hand_written(path: Path, report: str) -> str:
    """``report`` followed by what the file at ``path`` holds from its :data:`HAND_WRITTEN` line on (``report``
    alone when there is no such file or line).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "r.md"
    >>> _ = p.write_text("# old tables\\n\\n" + HAND_WRITTEN + "\\n## notes\\n")
    >>> keep_hand_written(p, "# new tables\\n").splitlines()[2:]
    ['<!-- written by hand from here on: rh3dgs eval --markdown keeps this part -->', '## notes']
    """
    try:
        old = Path(path).read_text()
    except FileNotFoundError:
        return report
    at = old.find(HAND_WRITTEN)
    return report if at < 0 else report.rstrip("\n") + "\n\n" + old[at:]


def write_summary(out: Path, cfg, rows: Sequence[str], runs: List[dict], sheets: List[str], quick: bool,
                  seconds: float, markdown_path: Optional[PathLike], records=None) -> Dict[str, object]:
    """``results.json`` and ``results.md`` (and ``markdown_path``) of a run's records; ``records`` (the run's saved
    maps, :class:`rh3dgs.eval.suite._Records`) adds the pixel transitions of the trained rows against the lift."""
    import torch

    from ..io.atomic import atomic_save_bytes, atomic_save_json
    from .rows import LIFT_OURS

    n_total = len(cfg.suite_pairs() if cfg.pairs is None else cfg.pairs) * len(rows)
    comps = comparisons(runs, rows)
    pngs = _plots(out, comps, runs, rows) + list(sheets)
    trs = []
    if records is not None and LIFT_OURS in rows:
        from .rows import ALL_ROWS

        kinds = {r[0]: r[1] for r in ALL_ROWS}
        trs = [{"method": m, "baseline": LIFT_OURS, "data": transitions(runs, records, m, LIFT_OURS)}
               for m in rows if kinds.get(m) == "distill"]
    summary = {
        "config": asdict(cfg), "quick": quick, "rows": list(rows), "runs": runs, "pngs": pngs,
        "complete": len(runs) == n_total, "runs_done": len(runs), "runs_total": n_total, "seconds": seconds,
        "threads": torch.get_num_threads(), "device": "CPU", "transitions": trs,
    }
    summary["comparisons_obj"] = comps
    md = suite_markdown(summary)
    summary["comparisons"] = _jsonable(comps)
    summary["acceptance"] = [{"target": t, "met": ok, "evidence": ev} for t, ok, ev in acceptance(comps, cfg.part)]
    atomic_save_json(out / "results.json", _jsonable({k: v for k, v in summary.items() if k != "comparisons_obj"}))
    atomic_save_bytes(out / "results.md", md.encode())
    if markdown_path is not None:
        mp = Path(markdown_path)
        atomic_save_bytes(mp, keep_hand_written(mp, suite_markdown(summary, _relative_prefix(out, mp))).encode())
    summary.pop("comparisons_obj")
    return summary


def _relative_prefix(out: Path, markdown_path: Path) -> str:
    prefix = os.path.relpath(Path(out).resolve(), Path(markdown_path).resolve().parent).replace(os.sep, "/") + "/"
    return "" if prefix == "./" else prefix


def load_summary(out: PathLike) -> Dict[str, object]:
    """A run's ``results.json`` with its comparisons recomputed (for :func:`parts_markdown`)."""
    import json

    s = json.loads((Path(out) / "results.json").read_text())
    s["comparisons_obj"] = comparisons(s["runs"], s["rows"])
    for tr in s.get("transitions", []):  # JSON keys of by_class were "scene|class" strings
        tr["data"]["by_class"] = {tuple(k.split("|", 1)): v for k, v in tr["data"].get("by_class", {}).items()}
    return s


def write_parts_markdown(outs: Dict[str, PathLike], markdown_path: PathLike, max_sheets: int = 2) -> Path:
    """``markdown_path`` (e.g. ``docs/results.md``) from the runs of the development and test parts in ``outs``.

    Each part's ``results.json``, ``results.md``, plots and first ``max_sheets`` qualitative sheets are copied next to
    it, into ``results/<part>/`` (the run folders keep their records, maps and datasets); what the file holds from its
    :data:`HAND_WRITTEN` line on is kept."""
    import shutil

    from ..io.atomic import atomic_save_bytes

    mp = Path(markdown_path)
    parts, prefixes = {}, {}
    for name, o in outs.items():
        s = load_summary(o)
        dest = mp.parent / "results" / name
        dest.mkdir(parents=True, exist_ok=True)
        sheets = [p for p in s["pngs"] if p.startswith("qualitative_")][:max_sheets]
        s["pngs"] = [p for p in s["pngs"] if not p.startswith("qualitative_")] + sheets
        for f in ["results.json", "results.md", *s["pngs"]]:
            shutil.copyfile(Path(o) / f, dest / f)
        parts[name], prefixes[name] = s, _relative_prefix(dest, mp)
    return atomic_save_bytes(mp, keep_hand_written(mp, parts_markdown(parts, prefixes)).encode())
