"""Text-query controls: query boxes, threshold, heat-map output, 3D selection, export.

Shared by ``rh3dgs view`` and the nerfstudio viewer plugin. Three layers, so the plugin can
take whichever it needs:

1. **Pure functions** (no viser, no :class:`~rh3dgs.api.Scene`): :func:`compose_output` (RGB / turbo
   heat map / overlay, via :mod:`rh3dgs.viz`), :func:`export_selection`. The query rules are
   :mod:`rh3dgs.query`'s (re-exported here for the viewers): :func:`parse_queries`,
   :func:`relevancy_maps` (latent map -> [Q, H, W], the numbers of ``Scene.render_relevancy``),
   :func:`heat_map` (``query.reduce_queries``), :func:`select_gaussians` (the numbers of
   ``Scene.select``).
2. :class:`QueryControls`: the user's choices (:class:`ControlState`) plus cached query
   encodings, per-Gaussian relevancy and the current selection for one semantic field.
   Thread-safe; no viser. ``frame(rgb, latent_map, alpha)`` turns a render into the image to show.
3. :class:`ViserControlPanel`: a thin binding of :class:`QueryControls` to a viser ``GuiApi``
   (and optionally a ``SceneApi`` for the selection's point cloud).

Shapes: N Gaussians, teacher dim D, latent dim d, Q positive / J negative queries, H x W pixels.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, Rh3dgsError
from ..field import SemanticField
from ..query import (
    CANONICAL_NEGATIVES,
    MIN_ALPHA,
    TEMPERATURE,
    THRESHOLD,
    Threshold,
    format_queries,
    gaussian_relevancy,
    parse_queries,
    relevancy_maps,
    select_gaussians,
)
from ..query import reduce_queries as heat_map
from ..ranges import check_fields
from ..viz import overlay_heatmap, turbo
from .guard import say_ignored

__all__ = [
    "OUTPUT_RGB", "OUTPUT_HEAT", "OUTPUT_OVERLAY", "OUTPUTS", "SHOW_ALL", "DEFAULT_NEGATIVES",
    "parse_queries", "format_queries", "relevancy_maps", "heat_map", "turbo_fast", "compose_output",
    "select_gaussians", "selection_name", "export_selection", "ControlState", "Selection", "QueryControls",
    "ViserControlPanel",
]

OUTPUT_RGB = "RGB"
OUTPUT_HEAT = "Relevancy (turbo)"
OUTPUT_OVERLAY = "RGB + relevancy"
OUTPUTS: Tuple[str, ...] = (OUTPUT_OVERLAY, OUTPUT_HEAT, OUTPUT_RGB)
SHOW_ALL = "all queries (max)"
DEFAULT_NEGATIVES = format_queries(CANONICAL_NEGATIVES)


# ------------------------------------------------------------------------------ pure functions
def _to_uint8(rgb: Tensor) -> np.ndarray:
    # = (clamp(rgb, 0, 1) * 255).round() bit for bit (x * 255 is monotone and exact at 0 and 255), in place
    return (rgb.detach().float().cpu() * 255).clamp_(0, 255).round_().to(torch.uint8).numpy()


_TURBO_LUT_SIZE = 4096
_turbo_lut: Optional[Tensor] = None


def turbo_fast(x: Tensor) -> Tensor:
    """:func:`rh3dgs.viz.turbo` through a 4096-entry table of it: [...] in [0, 1] -> [..., 3].

    Within 0.1 % of ``turbo`` (at most 1 level in uint8), one gather instead of a polynomial per pixel.
    """
    global _turbo_lut
    if _turbo_lut is None:
        _turbo_lut = turbo(torch.linspace(0, 1, _TURBO_LUT_SIZE, dtype=torch.float64)).float()
    idx = (x.detach().float().cpu().clamp(0, 1) * (_TURBO_LUT_SIZE - 1)).round().long()
    return _turbo_lut[idx]


def compose_output(output: str, rgb: Tensor, heat: Optional[Tensor] = None, alpha: Optional[Tensor] = None,
                   threshold: float = THRESHOLD, min_alpha: float = MIN_ALPHA) -> np.ndarray:
    """The image to show, uint8 [H, W, 3].

    ``OUTPUT_RGB``: ``rgb`` [H, W, 3] in [0, 1]. ``OUTPUT_HEAT``: turbo(``heat``) (absolute scale:
    0 -> dark blue, 1 -> dark red; :func:`turbo_fast`) where ``alpha >= min_alpha``, black elsewhere.
    ``OUTPUT_OVERLAY``: :func:`rh3dgs.viz.overlay_heatmap` of ``heat`` over ``rgb`` where
    ``heat > threshold`` (the same pixels, computed only where the heat map is above the threshold).
    Without a heat map every output falls back to RGB.
    """
    if output not in OUTPUTS:
        raise ConfigError(f"unknown output {output!r} (choose one of {', '.join(OUTPUTS)})")
    if heat is None or output == OUTPUT_RGB:
        return _to_uint8(rgb)
    heat = heat.detach().float().cpu()
    if output == OUTPUT_HEAT:
        img = turbo_fast(heat)
        if alpha is not None:
            img = img * (alpha.detach().cpu() >= min_alpha)[..., None]
        return _to_uint8(img)
    rgb = rgb.detach().float().cpu()  # a slice of an RGB + latents render is strided: read in place (no copy)
    img = _to_uint8(rgb)
    # the selected pixels, row-major: one nonzero, then their rows gathered and written back by index (two boolean
    # gathers and a boolean numpy write cost ~3.7 ms at 512x512 with a fifth selected, these ~0.8 ms)
    idx = torch.nonzero((heat > threshold).reshape(-1)).squeeze(1)
    if idx.numel():
        # overlay_heatmap clamps rgb and heat itself; rgb.reshape(-1, 3) is a view of a render's strided slice
        blend = overlay_heatmap(rgb.reshape(-1, 3).index_select(0, idx)[None],
                                heat.reshape(-1).index_select(0, idx)[None], threshold=threshold)[0]
        torch.from_numpy(img).view(-1, 3).index_copy_(0, idx, torch.from_numpy(blend))  # img's memory, in place
    return img


def selection_name(queries: Sequence[str]) -> str:
    """File stem for an exported selection: ``("red ball", "blue box")`` -> ``red_ball+blue_box``."""
    stems = [re.sub(r"[^A-Za-z0-9._-]+", "_", q).strip("_") or "query" for q in queries]
    return "+".join(stems)[:120] or "selection"


def export_selection(scene, folder, mask: Tensor, name: str) -> Path:
    """Write the Gaussians in ``mask`` as a 3DGS PLY with their ``sem_*`` latents (``Scene.export_ply(latents=True)``:
    the selection stays queryable) to ``folder/name.ply``, or ``name_2.ply``, ``name_3.ply``... when that exists: an
    export never replaces an earlier file."""
    n = int(mask.sum())
    if n == 0:
        raise ConfigError("the selection is empty: lower the threshold or change the query")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path, k = out / f"{name}.ply", 1
    while path.exists():
        k += 1
        path = out / f"{name}_{k}.ply"
    return scene.export_ply(path, mask=mask.to(scene.gaussians.device), latents=True)


# ------------------------------------------------------------------------------ state + caches
@dataclass(frozen=True)
class ControlState:
    """What the user chose. ``shown`` is one of ``positives`` or :data:`SHOW_ALL`."""

    positives: Tuple[str, ...] = ()
    negatives: Tuple[str, ...] = CANONICAL_NEGATIVES
    threshold: Threshold = THRESHOLD
    output: str = OUTPUT_OVERLAY
    shown: str = SHOW_ALL
    show_selection: bool = True

    def __post_init__(self) -> None:
        check_fields(self)  # a GUI value outside the range (a crafted message) is refused, not clamped

    @property
    def shown_index(self) -> Optional[int]:
        """Index into ``positives`` of the query shown, None for the max over all of them."""
        return self.positives.index(self.shown) if self.shown in self.positives else None

    @property
    def shown_queries(self) -> Tuple[str, ...]:
        i = self.shown_index
        return self.positives if i is None else (self.positives[i],)


@dataclass
class Selection:
    """Gaussians above the threshold: ``mask`` [N] bool, their ``relevancy`` [count] and a ``label``."""

    mask: Tensor
    relevancy: Tensor
    label: str

    @property
    def count(self) -> int:
        return int(self.mask.sum())


@dataclass
class Frame:
    """One composed frame: ``image`` uint8 [H, W, 3], the heat map [H, W] shown in it (if any), the
    query it shows, and (set by whoever rendered it) a z-depth map [H, W] for depth compositing."""

    image: np.ndarray
    heat: Optional[Tensor] = None
    query: str = ""
    depth: Optional[np.ndarray] = None


class QueryControls:
    """State and caches of the text-query controls for one semantic field (no viser).

    Args:
        field: the scene's :class:`SemanticField`, or None (queries are then off and
            ``disabled_reason`` says why).
        encode: strings -> [Q, D] unit vectors on the field's device (e.g. ``Scene.encode``).
        temperature: relevancy temperature (``Scene.temperature``).
        disabled_reason: shown when ``field`` is None.
    """

    def __init__(self, field: Optional[SemanticField], encode: Optional[Callable[[Sequence[str]], Tensor]],
                 temperature: float = TEMPERATURE, disabled_reason: Optional[str] = None,
                 state: Optional[ControlState] = None):
        self.field = field
        self._encode = encode
        self.temperature = float(temperature)
        self.disabled_reason = None if field is not None else (disabled_reason or "this scene has no semantic field")
        self._state = state or ControlState()
        self._lock = threading.RLock()
        self._enc_cache: Dict[Tuple[str, ...], object] = {}
        self._rel_cache: Optional[Tuple[Tuple, Tensor]] = None
        self._sel_cache: Optional[Tuple[Tuple, Selection]] = None
        self.error: Optional[str] = None
        self.version = 0

    @classmethod
    def from_scene(cls, scene, state: Optional[ControlState] = None) -> "QueryControls":
        reason = None
        if scene.field is None:
            try:
                scene._require_field()
            except Rh3dgsError as exc:
                reason = str(exc)
        return cls(scene.field, scene.encode, scene.temperature, reason, state)

    # -------------------------------------------------------------- state
    @property
    def enabled(self) -> bool:
        return self.field is not None

    @property
    def state(self) -> ControlState:
        with self._lock:
            return self._state

    def update(self, **changes) -> bool:
        """Change the state (``positives`` / ``negatives`` may be strings, parsed); True if it changed."""
        for key in ("positives", "negatives"):
            if isinstance(changes.get(key), str):
                changes[key] = parse_queries(changes[key])
        if "output" in changes and changes["output"] not in OUTPUTS:
            raise ConfigError(f"unknown output {changes['output']!r} (choose one of {', '.join(OUTPUTS)})")
        with self._lock:
            new = replace(self._state, **changes)
            if new.shown != SHOW_ALL and new.shown not in new.positives:
                new = replace(new, shown=SHOW_ALL)
            if new == self._state:
                return False
            self._state = new
            self.version += 1
            return True

    def shown_options(self) -> Tuple[str, ...]:
        """Options of the 'which query' choice: SHOW_ALL, then each positive query when there are several."""
        pos = self.state.positives
        return (SHOW_ALL,) + (pos if len(pos) > 1 else ())

    # -------------------------------------------------------------- queries
    def _encoded(self, texts: Tuple[str, ...]) -> Tensor:
        """[len(texts), D] (cached; so is a failure, so that a slow text model is not re-run every frame)."""
        if texts not in self._enc_cache:
            if len(self._enc_cache) > 64:
                self._enc_cache.clear()
            try:
                if self._encode is None:
                    raise ConfigError("no text encoder for this scene")
                self._enc_cache[texts] = self._encode(list(texts)) if texts else torch.zeros(
                    0, self.field.dim, device=self.field.latents.device)
            except Rh3dgsError as exc:
                self._enc_cache[texts] = exc
        out = self._enc_cache[texts]
        if isinstance(out, Rh3dgsError):
            raise out
        return out

    def encodings(self, state: Optional[ControlState] = None) -> Optional[Tuple[Tensor, Tensor]]:
        """(positives [Q, D], negatives [J, D]) for the state, or None when there is nothing to query
        (no field, no positive query, or the encoder failed: then ``self.error`` says why)."""
        st = state or self.state
        if not self.enabled or not st.positives:
            return None
        with self._lock:
            try:
                out = self._encoded(st.positives), self._encoded(st.negatives)
            except Rh3dgsError as exc:
                self.error = str(exc)
                return None
            self.error = None
            return out

    def wants_latents(self, state: Optional[ControlState] = None) -> bool:
        """Whether the next frame needs a latent map (a heat map will be shown)."""
        st = state or self.state
        return self.enabled and st.output != OUTPUT_RGB and self.encodings(st) is not None

    def frame(self, rgb: Tensor, latent_map: Optional[Tensor] = None, alpha: Optional[Tensor] = None,
              state: Optional[ControlState] = None) -> Frame:
        """Compose the image to show from a render: ``rgb`` [H, W, 3], ``latent_map`` [H, W, d], ``alpha`` [H, W]."""
        st = state or self.state
        enc = self.encodings(st) if latent_map is not None else None
        if enc is None or st.output == OUTPUT_RGB:
            return Frame(compose_output(OUTPUT_RGB, rgb))
        rel = relevancy_maps(self.field, latent_map, alpha, enc[0], enc[1], self.temperature)
        heat = heat_map(rel, st.shown_index)
        return Frame(compose_output(st.output, rgb, heat, alpha, st.threshold), heat, "; ".join(st.shown_queries))

    # -------------------------------------------------------------- 3D
    def gaussian_relevancy(self, state: Optional[ControlState] = None) -> Optional[Tensor]:
        """Per-Gaussian relevancy [Q, N] for the state's positives (cached), or None."""
        st = state or self.state
        enc = self.encodings(st)
        if enc is None:
            return None
        key = (st.positives, st.negatives)
        with self._lock:
            if self._rel_cache is None or self._rel_cache[0] != key:
                self._rel_cache = (key, gaussian_relevancy(self.field, enc[0], enc[1], self.temperature))
            return self._rel_cache[1]

    def selection(self, state: Optional[ControlState] = None) -> Optional[Selection]:
        """The Gaussians above the threshold for the shown query (cached), or None without a query."""
        st = state or self.state
        rel = self.gaussian_relevancy(st)
        if rel is None:
            return None
        key = (st.positives, st.negatives, st.shown, st.threshold)
        with self._lock:
            if self._sel_cache is None or self._sel_cache[0] != key:
                heat = heat_map(rel, st.shown_index)
                mask = select_gaussians(rel, st.threshold, st.shown_index)
                self._sel_cache = (key, Selection(mask, heat[mask], selection_name(st.shown_queries)))
            return self._sel_cache[1]

    def status_markdown(self) -> str:
        """A short status: why queries are off, the encoder error, or the selection count."""
        if not self.enabled:
            return f"**Queries are off**: {self.disabled_reason}"
        st = self.state
        if not st.positives:
            return "Type a query above (several: separate them with `;`)."
        sel = self.selection(st)
        if sel is None:
            return f"**Query error**: {self.error}"
        return (f"**Selection**: {sel.count:,} of {len(sel.mask):,} Gaussians above {st.threshold:.2f} "
                f"for '{'; '.join(st.shown_queries)}'")


# ------------------------------------------------------------------------------ viser binding
class ViserControlPanel:
    """The controls as viser GUI elements (``gui``: a viser ``GuiApi``, e.g. ``server.gui``).

    Args:
        gui: where to add the widgets.
        controls: the :class:`QueryControls` they drive.
        on_change: called (from viser's worker threads) after any change that alters the image.
        scene_api: optional viser ``SceneApi``: the selection is drawn there as a point cloud
            of the selected Gaussians' centres, coloured by relevancy (turbo).
        means: [N, 3] Gaussian centres, needed with ``scene_api``.
        export: ``(mask, name) -> Path`` called by the export button (hidden when None).
        point_size: size of the selection's points (world units).
        max_points: at most this many points are sent (evenly strided).
    """

    def __init__(self, gui, controls: QueryControls, on_change: Callable[[], None] = lambda: None, scene_api=None,
                 means: Optional[Tensor] = None, export: Optional[Callable[[Tensor, str], Path]] = None,
                 point_size: float = 0.01, max_points: int = 200_000):
        self.controls = controls
        self.on_change = on_change
        self.scene_api = scene_api
        self.means = None if means is None else means.detach().float().cpu().numpy()
        self.export_fn = export
        self.point_size = float(point_size)
        self.max_points = int(max_points)
        self.points_shown = False
        self._lock = threading.Lock()
        st = controls.state
        off = not controls.enabled
        with gui.add_folder("Text query"):
            self.positives = gui.add_text("Positives", initial_value=format_queries(st.positives), disabled=off,
                                          hint="text queries, separated by ';'")
            self.negatives = gui.add_text("Negatives", initial_value=format_queries(st.negatives), disabled=off,
                                          hint="canonical negatives, separated by ';'")
            self.shown = gui.add_dropdown("Show", options=controls.shown_options(), initial_value=SHOW_ALL,
                                          disabled=off, hint="which positive query drives the heat map and selection")
            self.threshold = gui.add_slider("Threshold", min=0.0, max=1.0, step=0.01, initial_value=st.threshold,
                                            disabled=off)
            self.output = gui.add_dropdown("Output", options=OUTPUTS, initial_value=st.output, disabled=off)
            self.show_selection = gui.add_checkbox("Show selection", initial_value=st.show_selection, disabled=off,
                                                   hint="draw the selected Gaussians' centres")
            self.status = gui.add_markdown(controls.status_markdown())
            self.export_button = gui.add_button("Export selection", disabled=off, visible=export is not None,
                                                hint="write the selected Gaussians as a 3DGS PLY")
            self.export_status = gui.add_markdown("")
        for h in (self.positives, self.negatives, self.shown, self.threshold, self.output, self.show_selection):
            h.on_update(lambda _event: self.sync())
        self.export_button.on_click(lambda _event: self.export())

    def sync(self) -> None:
        """Read every widget into the controls; refresh the dependent widgets; call ``on_change``."""
        with self._lock:
            try:
                changed = self.controls.update(positives=self.positives.value, negatives=self.negatives.value,
                                               threshold=self.threshold.value, output=self.output.value,
                                               shown=self.shown.value, show_selection=self.show_selection.value)
            except Rh3dgsError as exc:  # a value no widget offers (a crafted message): keep the last good state
                say_ignored(None, f"GUI value refused: {exc}")
                self._show(self.controls.state)
                return
            opts = self.controls.shown_options()
            if tuple(self.shown.options) != opts:
                self.shown.options = opts
            if changed:
                self.status.content = self.controls.status_markdown()
                self._draw_selection()
        if changed:
            self.on_change()

    def _show(self, st: ControlState) -> None:
        """Put the widgets back to ``st`` (after a refused value)."""
        for handle, value in ((self.threshold, st.threshold), (self.output, st.output), (self.shown, st.shown),
                              (self.show_selection, st.show_selection)):
            if handle.value != value:
                handle.value = value

    def _draw_selection(self) -> None:
        if self.scene_api is None or self.means is None:
            return
        st = self.controls.state
        sel = self.controls.selection(st) if st.show_selection else None
        if sel is None or sel.count == 0:
            if self.points_shown:
                self.scene_api.add_point_cloud("/rh3dgs_selection", np.zeros((0, 3), np.float32), (255, 0, 255),
                                               visible=False)
                self.points_shown = False
            return
        idx = sel.mask.nonzero()[:, 0].cpu()
        rel = sel.relevancy.detach().float().cpu()
        if len(idx) > self.max_points:
            keep = torch.linspace(0, len(idx) - 1, self.max_points).long()
            idx, rel = idx[keep], rel[keep]
        colors = (turbo(rel) * 255).round().to(torch.uint8).numpy()
        self.scene_api.add_point_cloud("/rh3dgs_selection", self.means[idx.numpy()], colors,
                                       point_size=self.point_size, point_shape="circle")
        self.points_shown = True

    def export(self) -> Optional[Path]:
        """Export the current selection through ``export``; reports in the panel, never raises."""
        sel = self.controls.selection()
        try:
            if sel is None:
                raise ConfigError(self.controls.error or "type a query first")
            if self.export_fn is None:
                raise ConfigError("export is not available here")
            path = self.export_fn(sel.mask, sel.label)
        except (Rh3dgsError, OSError) as exc:
            self.export_status.content = f"**Export failed**: {exc}"
            return None
        self.export_status.content = f"Exported {sel.count:,} Gaussians -> `{path}`"
        return path
