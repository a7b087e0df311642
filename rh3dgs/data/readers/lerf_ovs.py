"""LERF-OVS labels as distributed with LangSplat: ``label/<scene>/frame_XXXXX.json``.

Each JSON file is labelme-style::

    {"info": {"height": H, "width": W, "name": "frame_00041.jpg"},
     "objects": [{"category": "red apple", "bbox": [x1, y1, x2, y2],
                  "segmentation": [[x, y], [x, y], ...]}, ...]}

``segmentation`` is one polygon as a list of ``[x, y]`` points (a flat ``[x1, y1, x2, y2, ...]``
list and a list of several polygons are accepted too); x is the column, y the row, in
pixels. An object may appear several times (several polygons): the masks of one category
are the union of its polygons, as in LangSplat's evaluation. Polygons are rasterised with
PIL's even-odd polygon fill including the outline (the same pixels as OpenCV's
``fillPoly`` up to the half-pixel convention of the outline).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Union

import numpy as np

from ...errors import InputFileError
from ...memory import read_text_sized

__all__ = ["LerfLabelError", "LerfObject", "LerfFrame", "read_lerf_label", "load_lerf_ovs", "rasterize_polygon"]

PathLike = Union[str, Path]


class LerfLabelError(InputFileError):
    """A LERF-OVS label JSON is missing, not JSON, or lacks / mistypes a field."""


@dataclass
class LerfObject:
    """One labelled object: category, box ``[x1, y1, x2, y2]`` (pixels) and polygons (each [K, 2] x, y)."""

    category: str
    bbox: np.ndarray
    polygons: List[np.ndarray]


@dataclass
class LerfFrame:
    """One labelled frame (``path`` = its JSON file)."""

    path: Path
    name: str
    height: int
    width: int
    objects: List[LerfObject] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return Path(self.name).stem

    @property
    def categories(self) -> List[str]:
        """Categories in order of first appearance."""
        return list(dict.fromkeys(o.category for o in self.objects))

    def mask(self, category: str) -> np.ndarray:
        """bool [H, W]: union of the polygons of every object of ``category`` (all False if absent)."""
        m = np.zeros((self.height, self.width), dtype=bool)
        for o in self.objects:
            if o.category == category:
                for poly in o.polygons:
                    m |= rasterize_polygon(poly, self.height, self.width)
        return m

    def masks(self) -> Dict[str, np.ndarray]:
        """{category: bool [H, W]} for every category of the frame."""
        return {c: self.mask(c) for c in self.categories}

    def boxes(self, category: str) -> np.ndarray:
        """[M, 4] boxes ``x1, y1, x2, y2`` of ``category`` (for localisation accuracy)."""
        b = [o.bbox for o in self.objects if o.category == category]
        return np.stack(b) if b else np.zeros((0, 4))


def rasterize_polygon(polygon, height: int, width: int) -> np.ndarray:
    """bool [height, width] mask of a polygon given as [K, 2] ``(x, y)`` pixel points."""
    from PIL import Image, ImageDraw

    p = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
    img = Image.new("1", (int(width), int(height)), 0)
    if len(p) >= 2:
        ImageDraw.Draw(img).polygon([(float(x), float(y)) for x, y in p], fill=1, outline=1)
    return np.array(img, dtype=bool)


def _polygons(seg, path: Path, where: str) -> List[np.ndarray]:
    def bad(msg: str) -> LerfLabelError:
        return LerfLabelError(path, msg, field=where)

    if not isinstance(seg, list) or not seg:
        raise bad("must be a non-empty list of [x, y] points")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seg):  # flat x1, y1, x2, y2, ...
        if len(seg) % 2:
            raise bad(f"flat polygon has an odd number of coordinates ({len(seg)})")
        seg = [seg[i:i + 2] for i in range(0, len(seg), 2)]
        polys = [seg]
    elif all(isinstance(v, list) and len(v) == 2 and all(isinstance(c, (int, float)) for c in v) for v in seg):
        polys = [seg]
    elif all(isinstance(v, list) for v in seg):  # several polygons
        return [q for k, v in enumerate(seg) for q in _polygons(v, path, f"{where}[{k}]")]
    else:
        raise bad("must be a list of [x, y] points (numbers)")
    out = []
    for poly in polys:
        a = np.asarray(poly, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != 2 or len(a) < 3:
            raise bad(f"a polygon needs at least 3 [x, y] points, got shape {list(a.shape)}")
        if not np.isfinite(a).all():
            raise bad("polygon has NaN / Inf coordinates")
        out.append(a)
    return out


def read_lerf_label(path: PathLike) -> LerfFrame:
    """Parse one ``frame_XXXXX.json`` (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise LerfLabelError(p, "label file not found")
    try:
        data = json.loads(read_text_sized(p, "a LERF label file"))
    except (ValueError, RecursionError, OSError) as exc:  # JSONDecodeError, bad UTF-8, ints over the 4300-digit limit
        raise LerfLabelError(p, f"is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise LerfLabelError(p, "top level must be an object with 'info' and 'objects'")
    info = data.get("info")
    if not isinstance(info, dict):
        raise LerfLabelError(p, "missing or not an object", field="info")
    dims = {}
    for key in ("height", "width"):
        v = info.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v <= 0:
            raise LerfLabelError(p, f"must be a positive integer, got {v!r}", field=f"info.{key}")
        dims[key] = int(v)
    name = info.get("name", p.stem)
    if not isinstance(name, str) or not name:
        raise LerfLabelError(p, f"must be a non-empty string, got {name!r}", field="info.name")
    objs = data.get("objects")
    if not isinstance(objs, list):
        raise LerfLabelError(p, "missing or not a list", field="objects")
    objects = []
    for i, o in enumerate(objs):
        where = f"objects[{i}]"
        if not isinstance(o, dict):
            raise LerfLabelError(p, "must be an object", field=where)
        cat = o.get("category")
        if not isinstance(cat, str) or not cat.strip():
            raise LerfLabelError(p, f"must be a non-empty string, got {cat!r}", field=f"{where}.category")
        bb = o.get("bbox")
        try:
            bbox = np.asarray(bb, dtype=np.float64)
        except (TypeError, ValueError):
            bbox = np.zeros(0)
        if bbox.shape != (4,) or not np.isfinite(bbox).all():
            raise LerfLabelError(p, f"must be [x1, y1, x2, y2] numbers, got {bb!r}", field=f"{where}.bbox")
        if "segmentation" not in o:
            raise LerfLabelError(p, "missing", field=f"{where}.segmentation")
        polys = _polygons(o["segmentation"], p, f"{where}.segmentation")
        objects.append(LerfObject(cat.strip(), bbox, polys))
    return LerfFrame(p, name, dims["height"], dims["width"], objects)


def load_lerf_ovs(label_dir: PathLike, pattern: str = "frame_*.json") -> List[LerfFrame]:
    """All labelled frames of one scene folder (``label/<scene>``), sorted by file name."""
    d = Path(label_dir)
    if not d.is_dir():
        raise LerfLabelError(d, "label folder not found (expected label/<scene>/frame_XXXXX.json)")
    files = sorted(d.glob(pattern))
    if not files:
        raise LerfLabelError(d, f"no label files matching {pattern!r}")
    return [read_lerf_label(f) for f in files]
