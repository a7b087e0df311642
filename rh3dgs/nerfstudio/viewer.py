"""Text queries in nerfstudio's viewer (``ns-viewer --load-config ...`` and the live viewer of ``ns-train``).

:class:`TextQueryPanel` is a parameter-free ``nn.Module`` that :class:`~rh3dgs.nerfstudio.model.Rh3dgsModel`
holds as ``model.text_query``. nerfstudio 1.1.5's viewer finds GUI elements by walking the pipeline
(:func:`nerfstudio.viewer.utils.parse_object`: every public attribute that is a
:class:`~nerfstudio.viewer.viewer_elements.ViewerElement`, recursing into ``nn.Module`` attributes), so the
panel's elements appear in the *Control* tab under ``Custom Elements / model / text_query``:

* **Positives** (text): queries, separated by ``;``;
* **Negatives** (text): canonical negatives, default ``object;things;stuff;texture``;
* **Threshold** (slider): the relevancy threshold of the overlay and of the 3D selection;
* **Show** (dropdown): which positive query drives ``composited`` and the selection (or the max of all);
* **Show selection** (checkbox): tint the selected Gaussians in ``composited``;
* a status line (markdown): the selection's count, or why there is none.

While the model is not training and a positive query is set, :meth:`TextQueryPanel.outputs` adds to the
model's outputs (so nerfstudio's *Output type* dropdown lists them):

* ``relevancy_<i>`` [H, W, 1] in [0, 1] for positive query ``i`` (:func:`rh3dgs.query.relevancy_maps`,
  zero where the accumulated opacity is below :data:`rh3dgs.query.MIN_ALPHA`: the numbers of
  ``Scene.render_relevancy``); nerfstudio's default colormap
  for one float channel is turbo on the absolute [0, 1] scale;
* ``composited`` [H, W, 3]: :func:`rh3dgs.viewer.controls.compose_output` (RGB with the turbo heat map blended
  in above the threshold, :mod:`rh3dgs.viz`), with the 3D selection (Gaussians whose per-Gaussian relevancy
  is above the threshold, :meth:`rh3dgs.viewer.controls.QueryControls.selection`) tinted magenta: a second
  one-channel render of the selection mask gives each pixel's selected fraction.

The query logic is :mod:`rh3dgs.query` (parsing, relevancy, selection) and :mod:`rh3dgs.viewer.controls`
(encodings cache, overlay, the selection's cache);
this module only binds it to nerfstudio's elements and the model.

Text encoder: the datamanager's teacher (``precomputed`` reads ``features/text_embeddings.npz``; ``clip``
runs its text tower), built lazily on the first query. The panel learns the teacher from the viewer: a
:class:`~nerfstudio.viewer.viewer_elements.ViewerControl` (``_setup(viewer)`` is called by nerfstudio's viewer
with the pipeline) reads ``viewer.pipeline.datamanager.teacher_spec()``. Without a viewer, call
:meth:`TextQueryPanel.set_teacher_spec` or :meth:`TextQueryPanel.set_text_encoder`.

Security: the rh3dgs pipeline (:class:`rh3dgs.nerfstudio.pipeline.Rh3dgsPipeline`: ``ns-train rh3dgs``,
``ns-viewer --load-config`` on an rh3dgs run) installs :mod:`rh3dgs.viewer.guard` before nerfstudio starts its
viser server (:func:`install_viewer_guard`): only viser's asset files are served, WebSocket connections from a foreign
``Origin`` are refused, and the server binds 127.0.0.1 unless the command line names
``--viewer.websocket-host`` (``ns-viewer`` replaces the run's viewer config with its own defaults, whose
host is 0.0.0.0, so the run's ``websocket_host="127.0.0.1"`` alone does not reach it).
"""
from __future__ import annotations

import sys
import threading
import weakref
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nerfstudio.viewer.viewer_elements import (
    ViewerCheckbox,
    ViewerControl,
    ViewerDropdown,
    ViewerElement,
    ViewerSlider,
    ViewerText,
)

from ..errors import ConfigError, Rh3dgsError
from ..query import TEMPERATURE, THRESHOLD, parse_queries, reduce_queries, relevancy_maps
from ..viewer.controls import DEFAULT_NEGATIVES, OUTPUT_OVERLAY, SHOW_ALL, ControlState, QueryControls, compose_output
from ..viewer.guard import say_ignored

__all__ = ["ViewerMarkdown", "TextQueryPanel", "tint", "SELECTION_TINT", "SELECTION_TINT_STRENGTH", "COMPOSITED",
           "install_viewer_guard", "requested_viewer_host"]

COMPOSITED = "composited"
SELECTION_TINT = (1.0, 0.0, 1.0)
"""Colour the selected Gaussians are tinted with in ``composited`` (magenta: not a turbo colour)."""
SELECTION_TINT_STRENGTH = 0.5
"""Blend weight of the tint where a pixel is made entirely of selected Gaussians."""


class ViewerMarkdown(ViewerElement[str]):
    """A markdown line in nerfstudio's viewer (1.1.5 has none): ``content`` updates it in place."""

    def __init__(self, name: str, content: str = "", visible: bool = True) -> None:
        super().__init__(name, visible=visible)
        self._content = content

    def _create_gui_handle(self, viser_server) -> None:
        self.gui_handle = viser_server.gui.add_markdown(self._content, visible=self.visible)

    def install(self, viser_server) -> None:
        self._create_gui_handle(viser_server)

    @property
    def content(self) -> str:
        return self._content

    @content.setter
    def content(self, text: str) -> None:
        if text == self._content:
            return  # no message to the browser for an unchanged line (set on every frame)
        self._content = text
        if self.gui_handle is not None:
            self.gui_handle.content = text  # type: ignore[union-attr]


HOST_FLAGS = ("--viewer.websocket-host", "--viewer.websocket_host")


def requested_viewer_host(argv: Sequence[str]) -> Optional[str]:
    """The address given with ``--viewer.websocket-host`` (tyro also takes ``_``) on an ``ns-train`` /
    ``ns-viewer`` command line, else None."""
    for i, a in enumerate(argv):
        if a in HOST_FLAGS and i + 1 < len(argv):
            return argv[i + 1]
        for f in HOST_FLAGS:
            if a.startswith(f + "="):
                return a[len(f) + 1:]
    return None


def install_viewer_guard(argv: Optional[Sequence[str]] = None) -> None:
    """Install :mod:`rh3dgs.viewer.guard` for nerfstudio's viewer of this process; an address beyond
    127.0.0.1 is bound only when ``argv`` (default ``sys.argv``) names it with ``--viewer.websocket-host``."""
    from ..viewer import guard

    guard.install(explicit_host=requested_viewer_host(sys.argv if argv is None else argv))


def _say_where_it_listens(viewer) -> None:
    """nerfstudio's banner is made from its config ("listening on 0.0.0.0"); the guard may have bound
    127.0.0.1 instead: make the banner say where the server really listens."""
    server = getattr(viewer, "viser_server", None)
    if server is None or not isinstance(getattr(viewer, "viewer_info", None), list):
        return
    host, port = server.get_host(), server.get_port()
    if host != getattr(getattr(viewer, "config", None), "websocket_host", host):
        shown = f"[{host}]" if ":" in host else host
        viewer.viewer_info = [f"Viewer running locally at: http://{shown}:{port}"]


class _TeacherFromViewer(ViewerControl):
    """nerfstudio calls ``_setup(viewer)`` on every ViewerControl it finds in the pipeline: read the
    datamanager's teacher spec from there (ns-viewer and ns-train build the same datamanager), and make
    the viewer's banner name the address its server really listens on."""

    def __init__(self, panel: "TextQueryPanel") -> None:
        self._panel = weakref.ref(panel)

    def _setup(self, viewer) -> None:
        super()._setup(viewer)
        _say_where_it_listens(viewer)
        panel = self._panel()
        dm = getattr(getattr(viewer, "pipeline", None), "datamanager", None)
        if panel is None or dm is None or not hasattr(dm, "teacher_spec") or panel.has_text_encoder:
            return
        try:
            panel.set_teacher_spec(dm.teacher_spec())
        except Exception as exc:  # never break the viewer's start-up: queries then say why
            panel.encoder_error = f"no text encoder: {type(exc).__name__}: {exc}"


class TextQueryPanel(torch.nn.Module):
    """Text-query controls of an :class:`Rh3dgsModel` in nerfstudio's viewer (see module docstring).

    No parameters or buffers (the model's state dict is unchanged). Holds a weak reference to the model.

    Args:
        model: the owning model (``decoder`` / ``latents`` / ``semantic_field``).
        temperature: relevancy temperature (as :class:`rh3dgs.api.Scene`).
    """

    # Attribute names sort in display order: parse_object lists dir(), which is alphabetical.
    def __init__(self, model, temperature: float = TEMPERATURE) -> None:
        super().__init__()
        object.__setattr__(self, "_model_ref", weakref.ref(model))
        self.temperature = float(temperature)
        self._lock = threading.RLock()
        self._encode_fn: Optional[Callable[[Sequence[str]], Tensor]] = None
        self._teacher_spec: Optional[dict] = None
        self._teacher = None
        self._enc_cache: Dict[Tuple[str, ...], Tensor] = {}
        self.encoder_error: Optional[str] = None
        self._controls: Optional[QueryControls] = None
        self._controls_key = None
        self.q1_positives = ViewerText("Positives", "", cb_hook=self._on_queries,
                                       hint="text queries, separated by ';' (outputs relevancy_<i>, composited)")
        self.q2_negatives = ViewerText("Negatives", DEFAULT_NEGATIVES, cb_hook=self._on_queries,
                                       hint="canonical negatives, separated by ';'")
        self.q3_threshold = ViewerSlider("Threshold", THRESHOLD, 0.0, 1.0, 0.01,
                                         hint="relevancy threshold of the overlay and the 3D selection")
        self.q4_shown = ViewerDropdown("Show", SHOW_ALL, [SHOW_ALL],
                                       hint="which positive query drives 'composited' and the selection")
        self.q5_show_selection = ViewerCheckbox("Show selection", True,
                                                hint="tint the selected Gaussians in 'composited'")
        self.q6_status = ViewerMarkdown("Selection status", "Type a query above (several: separate them with `;`).")
        self.q7_teacher = _TeacherFromViewer(self)

    # ------------------------------------------------------------------ wiring
    def owner(self):
        """The model (a method, not an attribute: parse_object would recurse into it and back here)."""
        return self._model_ref()

    @property
    def has_text_encoder(self) -> bool:
        return self._encode_fn is not None or self._teacher_spec is not None

    def set_text_encoder(self, encode: Optional[Callable[[Sequence[str]], Tensor]]) -> None:
        """Use ``encode`` (strings -> [Q, D]) for the queries (replaces any teacher)."""
        with self._lock:
            self._encode_fn = encode
            self._teacher_spec, self._teacher = None, None
            self._enc_cache.clear()
            self._controls, self.encoder_error = None, None

    def set_teacher_spec(self, spec: Optional[dict]) -> None:
        """Encode queries with the teacher of ``spec`` (``Rh3dgsDataManager.teacher_spec()``), built on first use."""
        with self._lock:
            self._encode_fn = None
            self._teacher_spec, self._teacher = (dict(spec) if spec else None), None
            self._enc_cache.clear()
            self._controls, self.encoder_error = None, None

    def encode(self, texts: Sequence[str]) -> Tensor:
        """Strings -> [Q, D] unit vectors on the model's device (cached; failures raise :class:`Rh3dgsError`)."""
        texts = tuple(texts)
        model = self.owner()
        D = int(model.decoder.shape[0])
        dev = model.decoder.device
        with self._lock:
            if texts in self._enc_cache:
                return self._enc_cache[texts].to(dev)
            if not texts:
                return torch.zeros(0, D, device=dev)
            fn = self._encode_fn
            if fn is None and self._teacher_spec is not None:
                if self._teacher is None:
                    from ..teachers import teacher_from_spec

                    try:
                        self._teacher = teacher_from_spec(self._teacher_spec)
                    except Rh3dgsError:
                        raise
                    except Exception as exc:
                        raise ConfigError(f"cannot build the text encoder ({self._teacher_spec.get('name')}): "
                                          f"{type(exc).__name__}: {exc}") from exc
                fn = self._teacher.encode_text
            if fn is None:
                raise ConfigError(self.encoder_error or "no text encoder: the viewer did not provide the "
                                  "datamanager's teacher (TextQueryPanel.set_teacher_spec)")
            try:
                vecs = fn(list(texts))
            except Rh3dgsError:
                raise
            except Exception as exc:
                raise ConfigError(f"text encoder failed: {type(exc).__name__}: {exc}") from exc
            vecs = torch.as_tensor(vecs).float()
            if vecs.dim() != 2 or vecs.shape != (len(texts), D):
                raise ConfigError(f"text encoder gave {list(vecs.shape)} for {len(texts)} queries; the model's "
                                  f"teacher dimension is {D}")
            vecs = F.normalize(vecs, dim=-1)
            if len(self._enc_cache) > 64:
                self._enc_cache.clear()
            self._enc_cache[texts] = vecs.cpu()
            return vecs.to(dev)

    # ------------------------------------------------------------------ state
    def state(self) -> ControlState:
        """The elements' current values as a :class:`ControlState` (default values before the viewer installs them)."""
        pos = parse_queries(self.q1_positives.value)
        shown = self.q4_shown.value
        last = getattr(self, "_last_state", None) or ControlState()
        try:
            st = ControlState(positives=pos, negatives=parse_queries(self.q2_negatives.value),
                              threshold=float(self.q3_threshold.value), output=OUTPUT_OVERLAY,
                              shown=shown if shown in pos else SHOW_ALL, show_selection=bool(self.q5_show_selection.value))
        except (Rh3dgsError, TypeError, ValueError) as exc:  # a value the slider does not offer (a crafted message)
            say_ignored(None, f"GUI value refused: {exc}")
            self.q3_threshold.value = last.threshold
            return last
        self._last_state = st
        return st

    def _on_queries(self, _element=None) -> None:
        """Positives changed: refresh the 'Show' options (SHOW_ALL, then each query when there are several)."""
        pos = parse_queries(self.q1_positives.value)
        opts = [SHOW_ALL] + (list(pos) if len(pos) > 1 else [])
        if list(self.q4_shown.options) != opts:
            self.q4_shown.set_options(opts)
            if self.q4_shown.value not in opts:
                self.q4_shown.value = SHOW_ALL

    def controls(self) -> QueryControls:
        """A :class:`QueryControls` for the model's current semantic field and the elements' state.

        Rebuilt when the field changes (every training step in the live viewer, never in ns-viewer); the
        text encodings are cached here, across rebuilds.
        """
        model = self.owner()
        lat, dec = model.latents, model.decoder
        key = (int(getattr(model, "step", 0)), tuple(lat.shape), lat.data_ptr(), tuple(dec.shape), dec.data_ptr(),
               lat._version, dec._version)
        st = self.state()
        with self._lock:
            if self._controls is None or self._controls_key != key:
                self._controls = QueryControls(model.semantic_field(), self.encode, self.temperature, state=st)
                self._controls_key = key
            else:
                self._controls.update(**{k: getattr(st, k) for k in ("positives", "negatives", "threshold", "shown",
                                                                    "show_selection")})
            return self._controls

    # ------------------------------------------------------------------ outputs
    @torch.no_grad()
    def outputs(self, out: Dict[str, Tensor], gaussians=None, cameras=None,
                crop_ids: Optional[Tensor] = None) -> Dict[str, Tensor]:
        """``relevancy_<i>`` and ``composited`` for the model's render ``out`` (empty without a positive query).

        Args:
            out: ``get_outputs`` result (``rgb`` [H, W, 3], ``accumulation`` [H, W, 1], ``latents`` [H, W, d]).
            gaussians / cameras: the :class:`rh3dgs.Gaussians` and camera of that render (optional): with them
                the 3D selection is tinted in ``composited``.
            crop_ids: the crop mask the Gaussians were cut with (the selection is cut the same way).
        """
        st = self.state()
        if not st.positives or "latents" not in out:
            self.q6_status.content = ("Type a query above (several: separate them with `;`)."
                                      if not st.positives else "")
            return {}
        ctl = self.controls()
        enc = ctl.encodings(ctl.state)
        if enc is None:
            self.q6_status.content = f"**Query error**: {ctl.error}"
            return {}
        st = ctl.state
        pos, neg = enc
        alpha = out["accumulation"][..., 0]
        stack = relevancy_maps(ctl.field, out["latents"], alpha, pos, neg, self.temperature)  # [Q, H, W]
        rel = {f"relevancy_{i}": stack[i][..., None] for i in range(stack.shape[0])}
        heat = reduce_queries(stack, st.shown_index)
        img = compose_output(OUTPUT_OVERLAY, out["rgb"], heat, alpha, st.threshold)
        comp = torch.from_numpy(img).to(out["rgb"].device).float() / 255.0
        sel = ctl.selection(st)
        if sel is not None and st.show_selection and gaussians is not None and cameras is not None and sel.count:
            mask = sel.mask if crop_ids is None else sel.mask[crop_ids.to(sel.mask.device)]
            if mask.shape[0] == len(gaussians) and bool(mask.any()):
                frac = self.selection_fraction(gaussians, cameras, mask).to(comp.device)
                comp = tint(comp, frac)
        self.q6_status.content = ctl.status_markdown()
        return {**rel, COMPOSITED: comp}

    @staticmethod
    def selection_fraction(gaussians, cameras, mask: Tensor) -> Tensor:
        """[H, W, 1]: the part of each pixel's colour that comes from Gaussians in ``mask`` [N] (one render)."""
        from ..rendering import render

        feat = mask.to(gaussians.means.device).float()[:, None]
        res = render(gaussians, cameras, feat, rgb=False)
        return res.features[0].clamp(0, 1)


def tint(image: Tensor, fraction: Tensor, color: Sequence[float] = SELECTION_TINT,
         strength: float = SELECTION_TINT_STRENGTH) -> Tensor:
    """Blend ``color`` into ``image`` [H, W, 3] by ``strength * fraction`` ([H, W, 1] in [0, 1])."""
    w = (strength * fraction).clamp(0, 1)
    c = torch.tensor(color, dtype=image.dtype, device=image.device)
    return image * (1 - w) + c * w
