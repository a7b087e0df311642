"""The Python API: ``rh3dgs.load(path)`` -> :class:`Scene`, text queries against it.

``rh3dgs.load`` accepts a semantic scene folder (written by ``rh3dgs lift``, the demo and
:func:`rh3dgs.io.scene.save_scene`), its ``rh3dgs.json``, a plain 3DGS PLY (RGB only; queries
then raise a clear error) or an ``ns-train rh3dgs`` run's ``config.yml``. The formats live in
:mod:`rh3dgs.io.scene` and :mod:`rh3dgs.io.nerfstudio_run`; this module joins their parts into
a :class:`Scene`.

The scene's teacher is built lazily, on the first text that is neither a stored text
embedding nor a vector: loading, rendering, exporting and selecting with vectors or stored
phrases never need its weights or its device.

The API refuses what the command line refuses, with the same :mod:`rh3dgs.errors` (the CLI calls
it): a camera index outside the scene's cameras, an empty query list, a threshold, temperature or
``min_alpha`` outside its declared range (:mod:`rh3dgs.ranges`), an export onto a file the scene
was read from (:func:`rh3dgs.io.outputs.check_not_input`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError, InputFileError, MissingWeightsError, ShapeError
from .field import SemanticField
from .gaussians import Gaussians
from .io.scene import SceneData, read_scene, save_scene
from .query import (CANONICAL_NEGATIVES, MIN_ALPHA, TEMPERATURE, THRESHOLD, MinAlpha, Temperature, gaussian_relevancy,
                    relevancy_maps, select_gaussians)
from .ranges import check_value

__all__ = ["Scene", "load", "save_scene", "TextEmbeddings"]

Query = Union[str, Tensor, np.ndarray]
CameraLike = Union[Cameras, int]


@dataclass
class TextEmbeddings:
    """A text encoder backed by a table of phrase -> unit vector, with an optional fallback encoder."""

    table: Dict[str, Tensor] = field(default_factory=dict)
    fallback: Optional[Callable[[Sequence[str]], Tensor]] = None
    source: str = "<memory>"

    def __call__(self, texts: Sequence[str]) -> Tensor:
        out = []
        missing = [t for t in texts if t not in self.table]
        enc = {}
        if missing:
            if self.fallback is None:
                known = ", ".join(sorted(self.table)[:8])
                raise ConfigError(f"no text embedding for {missing[0]!r} in {self.source} and no text model to "
                                  f"encode it (known: {known}{', ...' if len(self.table) > 8 else ''})")
            enc = dict(zip(missing, self.fallback(missing)))
        for t in texts:
            out.append(self.table[t] if t in self.table else enc[t])
        return torch.nn.functional.normalize(torch.stack([torch.as_tensor(v).float() for v in out]), dim=-1)


class Scene:
    """Gaussians + optional semantic field + optional cameras + a text encoder.

    Shapes: N Gaussians, teacher dim D, latent dim d, Q queries, image H x W.
    """

    def __init__(self, gaussians: Gaussians, field: Optional[SemanticField] = None, cameras: Optional[Cameras] = None,
                 text_encoder: Optional[Callable[[Sequence[str]], Tensor]] = None,
                 negatives: Sequence[str] = CANONICAL_NEGATIVES, temperature: float = TEMPERATURE,
                 path: Optional[Path] = None):
        self.gaussians = gaussians
        self.field = field
        self.cameras = cameras
        self.text_encoder = text_encoder
        self.negatives = tuple(negatives)
        self.temperature = float(check_value("temperature", temperature, Temperature))
        self.path = path

    # ---------------------------------------------------------------- helpers
    def __len__(self) -> int:
        return len(self.gaussians)

    def _require_field(self) -> SemanticField:
        if self.field is None:
            where = f" ({self.path})" if self.path else ""
            raise ConfigError(f"this scene{where} has no semantic field (no sem_* latents / decoder): "
                              "run `rh3dgs lift` on it first")
        return self.field

    def _camera(self, camera: CameraLike) -> Cameras:
        if isinstance(camera, (int, np.integer)) and not isinstance(camera, bool):
            if self.cameras is None:
                raise ConfigError("the scene has no cameras: pass an rh3dgs.Cameras")
            n = len(self.cameras)
            if not 0 <= int(camera) < n:  # no negative indices: -1 is a typo more often than "the last"
                raise ConfigError(f"camera index {int(camera)} is outside the scene's cameras 0..{n - 1}")
            return self.cameras[int(camera)]
        if not isinstance(camera, Cameras):
            raise ConfigError(f"camera must be an index or an rh3dgs.Cameras, got {type(camera).__name__}")
        if len(camera) != 1:
            raise ShapeError(f"expected one camera, got {len(camera)}")
        return camera

    def encode(self, queries: Union[Query, Sequence[Query]]) -> Tensor:
        """Strings (through the scene's text encoder) or D-vectors -> [Q, D] unit."""
        if isinstance(queries, (str, Tensor, np.ndarray)):
            queries = [queries]
        queries = list(queries)
        if not queries:
            raise ConfigError("no query given: pass a phrase, a vector, or a list of them")
        field_ = self._require_field()
        vecs: List[Optional[Tensor]] = [None] * len(queries)
        texts = [(i, q) for i, q in enumerate(queries) if isinstance(q, str)]
        if texts:
            if self.text_encoder is None:
                raise ConfigError("this scene has no text encoder: pass query vectors, or load a scene folder whose "
                                  "rh3dgs.json names its teacher")
            enc = self.text_encoder([q for _, q in texts])
            for (i, _), v in zip(texts, enc):
                vecs[i] = v
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                vecs[i] = torch.as_tensor(q, dtype=torch.float32).reshape(-1)
        out = torch.stack([v.float() for v in vecs])  # type: ignore[union-attr]
        if out.shape[-1] != field_.dim:
            raise ShapeError(f"query dimension {out.shape[-1]} != the scene's teacher dimension {field_.dim}")
        if (out.norm(dim=-1) < 1e-8).any() or not torch.isfinite(out).all():
            raise ShapeError("query vectors must be finite and non-zero")
        return torch.nn.functional.normalize(out, dim=-1).to(self.gaussians.device)

    def _negatives(self, negatives: Optional[Sequence[Query]]) -> Tensor:
        negs = self.negatives if negatives is None else tuple(negatives)
        if not negs:
            return torch.zeros(0, self._require_field().dim, device=self.gaussians.device)
        return self.encode(list(negs))

    # ---------------------------------------------------------------- rendering
    def render(self, camera: CameraLike) -> Tensor:
        """[H, W, 3] RGB."""
        from .rendering import render

        with torch.no_grad():
            return render(self.gaussians, self._camera(camera)).rgb[0]

    def render_latents(self, camera: CameraLike):
        """(latent map [H, W, d], alpha [H, W], rgb [H, W, 3]) in one rasterization."""
        from .rendering import render

        f = self._require_field()
        with torch.no_grad():
            r = render(self.gaussians, self._camera(camera), f.latents)
        return r.features[0], r.alpha[0], r.rgb[0]

    def render_relevancy(self, camera: CameraLike, queries: Union[Query, Sequence[Query]],
                         negatives: Optional[Sequence[Query]] = None, min_alpha: float = MIN_ALPHA) -> Tensor:
        """[Q, H, W] relevancy in [0, 1] (0 where accumulated opacity < ``min_alpha``): :func:`rh3dgs.query.relevancy_maps`.

        Uses the linear fast path: one d-dimensional dot product per pixel and query.
        """
        f = self._require_field()
        check_value("min_alpha", min_alpha, MinAlpha)
        phi, neg = self.encode(queries), self._negatives(negatives)
        lat, alpha, _ = self.render_latents(camera)
        return relevancy_maps(f, lat, alpha, phi, neg, self.temperature, min_alpha)

    # ---------------------------------------------------------------- 3D
    def relevancy(self, queries: Union[Query, Sequence[Query]], negatives: Optional[Sequence[Query]] = None) -> Tensor:
        """Per-Gaussian relevancy [Q, N] (0 for Gaussians without a valid feature): :func:`rh3dgs.query.gaussian_relevancy`."""
        phi, neg = self.encode(queries), self._negatives(negatives)
        return gaussian_relevancy(self._require_field(), phi, neg, self.temperature)

    def select(self, query: Query, threshold: float = THRESHOLD, negatives: Optional[Sequence[Query]] = None) -> Tensor:
        """bool [N]: Gaussians whose relevancy for ``query`` is above ``threshold``."""
        return select_gaussians(self.relevancy([query], negatives), threshold)

    def export_ply(self, path, mask: Optional[Tensor] = None, latents: bool = False,
                   latent_dtype: str = "float32", extra: bool = False) -> Path:
        """Write the (selected) Gaussians as a PLY.

        By default a plain INRIA 3DGS PLY that every 3DGS tool reads: exactly INRIA's properties, every one a
        float (``save_ply(plain=True)``); ``extra=True`` adds the scene's other per-Gaussian columns
        (``class_id``...), ``latents=True`` the field's latents as ``sem_*`` (float32 under rh3dgs's marker, or the
        compact rh3dgs-only ``latent_dtype="float16"``; see :mod:`rh3dgs.io.ply`).
        """
        from .io.outputs import check_not_input, scene_inputs
        from .io.ply import save_ply

        if self.path is not None:  # never over a file this scene was read from (what the CLI refuses too)
            check_not_input(path, scene_inputs(self.path))
        g = self.gaussians
        if not latents:
            return save_ply(path, g, mask=mask, plain=True, extra=extra)
        if self.field is not None:
            g = Gaussians(g.means, g.scales, g.quats, g.opacities, g.sh0, g.shN, self.field.latents, dict(g.extra))
        return save_ply(path, g, mask=mask, latent_dtype=latent_dtype)


# ------------------------------------------------------------------------- loading
class _LazyTeacherText:
    """``encode_text`` of the teacher a scene names, built on the first call (not when the scene loads).

    A spec that cannot be built (unknown name, bad settings, a device this machine lacks) raises
    :class:`InputFileError` naming ``source`` (the rh3dgs.json / config.yml) and field ``teacher``.
    """

    def __init__(self, spec: Dict[str, Any], base: Path, source: Path):
        self.spec, self.base, self.source = spec, base, source
        self._teacher = None

    def __call__(self, texts: Sequence[str]) -> Tensor:
        if self._teacher is None:
            from .teachers import teacher_from_spec

            try:
                self._teacher = teacher_from_spec(self.spec, base=self.base)
            except (InputFileError, MissingWeightsError):  # these name their file already
                raise
            except (ConfigError, TypeError, ValueError) as exc:
                raise InputFileError(self.source, f"cannot build the teacher it names ({type(exc).__name__}: {exc})",
                                     field="teacher") from None
        return self._teacher.encode_text(texts)


def _text_encoder(data: SceneData) -> Optional[TextEmbeddings]:
    """Stored text embeddings first, then the scene's teacher (built lazily); None without either."""
    fallback = None
    if data.teacher:
        fallback = _LazyTeacherText(data.teacher, data.source.parent, data.source)
    if not data.text_embeddings and fallback is None:
        return None
    return TextEmbeddings(dict(data.text_embeddings), fallback, source=str(data.path))


def load(path, device: Union[str, torch.device] = "cpu") -> Scene:
    """Open a semantic scene folder, its rh3dgs.json, a 3DGS PLY, or an ``ns-train rh3dgs`` config.yml.

    Raises :class:`rh3dgs.errors.InputFileError` (or a subclass: ``PlyFormatError``,
    ``CameraFormatError``...) naming the file and field when it is none of these, or when
    one of the scene's files is missing, corrupt, or inconsistent with the others
    (:func:`rh3dgs.io.scene.read_scene`). The teacher is not built here (module docstring).
    """
    data = read_scene(path, device)
    fld = None if data.decoder is None else SemanticField(data.gaussians.latents, data.decoder, data.valid, data.filled)
    return Scene(data.gaussians, fld, data.cameras, text_encoder=_text_encoder(data), path=data.path)
