"""The Python API: ``rh3dgs.load(path)`` -> :class:`Scene`, text queries against it.

A *semantic scene folder* (written by :func:`save_scene`, ``rh3dgs lift`` and the demo)::

    semantic.ply      3DGS PLY (INRIA layout) with the latents as sem_0..sem_{d-1} (float32, see rh3dgs.io.ply)
    field.npz         decoder [D, d] (+ optional text embeddings, names -> [D])
    rh3dgs.json       metadata: teacher spec (how to encode text), cameras file, lift info
    transforms.json   (optional) cameras

``rh3dgs.load`` accepts that folder, its ``rh3dgs.json``, or a plain 3DGS PLY (RGB only;
queries then raise a clear error).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from .cameras import Cameras
from .errors import ConfigError, InputFileError, MissingWeightsError, ShapeError
from .field import SemanticField
from .gaussians import Gaussians
from .query import CANONICAL_NEGATIVES

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
                 negatives: Sequence[str] = CANONICAL_NEGATIVES, temperature: float = 10.0,
                 path: Optional[Path] = None):
        self.gaussians = gaussians
        self.field = field
        self.cameras = cameras
        self.text_encoder = text_encoder
        self.negatives = tuple(negatives)
        self.temperature = float(temperature)
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
        if isinstance(camera, int):
            if self.cameras is None:
                raise ConfigError("the scene has no cameras: pass an rh3dgs.Cameras")
            return self.cameras[camera]
        if len(camera) != 1:
            raise ShapeError(f"expected one camera, got {len(camera)}")
        return camera

    def encode(self, queries: Union[Query, Sequence[Query]]) -> Tensor:
        """Strings (through the scene's text encoder) or D-vectors -> [Q, D] unit."""
        if isinstance(queries, (str, Tensor, np.ndarray)):
            queries = [queries]
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
                         negatives: Optional[Sequence[Query]] = None, min_alpha: float = 0.1) -> Tensor:
        """[Q, H, W] relevancy in [0, 1] (0 where accumulated opacity < ``min_alpha``).

        Uses the linear fast path: one d-dimensional dot product per pixel and query.
        """
        f = self._require_field()
        phi, neg = self.encode(queries), self._negatives(negatives)
        lat, alpha, _ = self.render_latents(camera)
        rel = f.relevancy(lat, phi, neg, self.temperature)
        return (rel * (alpha >= min_alpha)[..., None]).permute(2, 0, 1)

    # ---------------------------------------------------------------- 3D
    def relevancy(self, queries: Union[Query, Sequence[Query]], negatives: Optional[Sequence[Query]] = None) -> Tensor:
        """Per-Gaussian relevancy [Q, N] (0 for Gaussians without a valid feature)."""
        phi, neg = self.encode(queries), self._negatives(negatives)
        return self._require_field().gaussian_relevancy(phi, neg, self.temperature)

    def select(self, query: Query, threshold: float = 0.5, negatives: Optional[Sequence[Query]] = None) -> Tensor:
        """bool [N]: Gaussians whose relevancy for ``query`` is above ``threshold``."""
        return self.relevancy([query], negatives)[0] > threshold

    def export_ply(self, path, mask: Optional[Tensor] = None, latents: bool = False,
                   latent_dtype: str = "float32") -> Path:
        """Write the (selected) Gaussians as a PLY.

        By default a plain INRIA 3DGS PLY that every 3DGS tool reads (no ``sem_*``, every property
        a float: ``save_ply(plain=True)``); ``latents=True`` adds the field's latents as ``sem_*``
        (float32 under rh3dgs's marker, or the compact rh3dgs-only ``latent_dtype="float16"``;
        see :mod:`rh3dgs.io.ply`).
        """
        from .io.ply import save_ply

        g = self.gaussians
        if not latents:
            return save_ply(path, g, mask=mask, plain=True)
        if self.field is not None:
            g = Gaussians(g.means, g.scales, g.quats, g.opacities, g.sh0, g.shN, self.field.latents, dict(g.extra))
        return save_ply(path, g, mask=mask, latent_dtype=latent_dtype)


# ------------------------------------------------------------------------- persistence
def save_scene(folder, gaussians: Gaussians, field: Optional[SemanticField] = None, cameras: Optional[Cameras] = None,
               image_paths: Optional[Sequence] = None, teacher: Optional[dict] = None,
               text_embeddings: Optional[Dict[str, Tensor]] = None, info: Optional[dict] = None,
               latent_dtype: str = "float32") -> Path:
    """Write a semantic scene folder (see the module docstring); every file atomically.

    The latents go to semantic.ply as float32 by default (``latent_dtype``; the compact
    rh3dgs-only "float16" rounds them, relative error <= 2^-11; see :mod:`rh3dgs.io.ply`).
    """
    from .io.atomic import atomic_save_json, atomic_save_npz
    from .io.ply import save_ply
    from .io.transforms import save_transforms

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    # rh3dgs.json is written last and marks a complete scene: drop an old one first, so that an
    # interrupted overwrite leaves a folder `load` refuses, never a mix of old and new files.
    (out / "rh3dgs.json").unlink(missing_ok=True)
    g = gaussians
    if field is not None:
        g = Gaussians(g.means, g.scales, g.quats, g.opacities, g.sh0, g.shN, field.latents, dict(g.extra))
        arrays = {"decoder": field.decoder.detach().cpu().numpy()}
        if field.valid is not None:
            arrays["valid"] = field.valid.cpu().numpy()
        if text_embeddings:
            names = sorted(text_embeddings)
            arrays["text_names"] = np.array(names)
            arrays["text_vectors"] = torch.stack([torch.as_tensor(text_embeddings[k]).float() for k in names]).numpy()
        atomic_save_npz(out / "field.npz", arrays)
    save_ply(out / "semantic.ply", g, latent_dtype=latent_dtype)
    meta = {"format": "rh3dgs-scene", "version": 1, "ply": "semantic.ply", "field": "field.npz" if field else None,
            "teacher": teacher or None, "info": info or {}}
    if cameras is not None:
        if image_paths is None:
            image_paths = [out / "images" / f"{n}.png" for n in (cameras.names or [f"frame_{i:05d}" for i in range(len(cameras))])]
        save_transforms(out / "transforms.json", cameras, list(image_paths))
        meta["transforms"] = "transforms.json"
    atomic_save_json(out / "rh3dgs.json", meta)
    return out


def _text_encoder_from(meta: dict, folder: Path, arrays) -> Optional[TextEmbeddings]:
    table = {}
    if arrays is not None and "text_names" in arrays:
        table = {str(n): torch.from_numpy(v) for n, v in zip(arrays["text_names"], arrays["text_vectors"])}
    fallback = None
    spec = meta.get("teacher")
    if spec:
        from .teachers import teacher_from_spec

        teacher = teacher_from_spec(spec, base=folder)
        fallback = teacher.encode_text
    if not table and fallback is None:
        return None
    return TextEmbeddings(table, fallback, source=str(folder))


def _scene_file(meta_path: Path, meta: dict, key: str, default: Optional[str] = None, required: bool = False):
    """The file named by ``meta[key]`` (a non-empty relative or absolute path string), or None."""
    v = meta.get(key, default)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v or "\x00" in v:
        raise InputFileError(meta_path, f"must be a file name (a non-empty string), got {json.dumps(v)[:60]}", field=key)
    path = meta_path.parent / v
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # reported by the reader with its own message
    except (OSError, ValueError) as exc:  # e.g. ENAMETOOLONG
        raise InputFileError(meta_path, f"names a path that cannot be opened ({exc})"[:200], field=key) from None
    return path


def _read_field_npz(fpath: Path) -> Dict[str, np.ndarray]:
    """Every array of field.npz, read eagerly; any corruption -> InputFileError naming the file."""
    import zipfile
    import zlib

    try:
        with np.load(fpath, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):  # pragma: no cover - np.load returns arrays for .npy
                raise InputFileError(fpath, "is not an .npz archive")
            return {k: z[k] for k in z.files}
    except InputFileError:
        raise
    except AttributeError:  # np.load returned a plain array (.npy bytes): no context manager / files
        raise InputFileError(fpath, "is an .npy array, expected an .npz archive (decoder, valid, text_*)") from None
    except (OSError, ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile, zlib.error, MemoryError,
            NotImplementedError, RuntimeError) as exc:
        raise InputFileError(fpath, f"cannot be read as .npz ({type(exc).__name__}: {exc})") from None


def _field_array(fpath: Path, arrays: Dict[str, np.ndarray], key: str, ndim: int, kinds: str = "fiu") -> np.ndarray:
    a = arrays[key]
    if not isinstance(a, np.ndarray) or a.dtype.kind not in kinds or a.ndim != ndim:
        raise InputFileError(fpath, f"must be a {ndim}-D {'numeric' if kinds != 'U' else 'string'} array, got "
                                    f"{getattr(a, 'dtype', type(a).__name__)} of shape {getattr(a, 'shape', None)}",
                             field=key)
    if kinds != "U" and a.dtype.kind == "f" and not np.isfinite(a).all():
        raise InputFileError(fpath, f"{int((~np.isfinite(a)).sum())} non-finite values (NaN/Inf)", field=key)
    return a


def _load_nerfstudio_run(config_yml: Path, device) -> Scene:
    """A trained ``ns-train rh3dgs`` run (its config.yml), in the dataset's camera frame."""
    from .nerfstudio.export import load_nerfstudio_scene

    g, decoder, cams, spec = load_nerfstudio_scene(config_yml, device=device)
    field_ = SemanticField(g.latents, decoder.to(g.latents))
    return Scene(g, field_, cams, text_encoder=_text_encoder_from({"teacher": spec}, config_yml.parent, None),
                 path=config_yml)


def load(path, device: Union[str, torch.device] = "cpu") -> Scene:
    """Open a semantic scene folder, its rh3dgs.json, a 3DGS PLY, or an ``ns-train rh3dgs`` config.yml.

    Raises :class:`rh3dgs.errors.InputFileError` (or a subclass: ``PlyFormatError``,
    ``CameraFormatError``...) naming the file and field when it is none of these, or when
    one of the scene's files is missing, corrupt, or inconsistent with the others.
    """
    from .io.ply import load_ply
    from .io.transforms import load_transforms

    p = Path(path)
    try:
        exists = p.exists()
    except (OSError, ValueError) as exc:
        raise InputFileError(p, f"cannot be accessed ({exc})") from None
    if not exists:
        raise InputFileError(p, "does not exist (expected a semantic scene folder, its rh3dgs.json, or a 3DGS .ply)")
    if p.is_file() and p.suffix.lower() in (".yml", ".yaml"):
        return _load_nerfstudio_run(p, device)
    if p.is_file() and p.suffix.lower() == ".ply":
        g = load_ply(p, device=device)
        fld = None
        if g.latents is not None:
            raise InputFileError(p, "has sem_* latents but no decoder: open the scene folder (with field.npz) instead")
        cams = None
        tj = p.parent / "transforms.json"
        if tj.exists():
            cams, _ = load_transforms(tj, check_images=False, require_images=False)
        return Scene(g, fld, cams, path=p)
    folder = p.parent if p.is_file() else p
    meta_path = folder / "rh3dgs.json"
    if not meta_path.is_file():
        raise InputFileError(p, "is not an rh3dgs scene: no rh3dgs.json (expected a folder written by `rh3dgs lift` or "
                                "`rh3dgs demo`, or a 3DGS .ply file); an interrupted `rh3dgs lift` leaves none: re-run it")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError, int digit limit
        raise InputFileError(meta_path, f"is not valid JSON ({exc})") from None
    except OSError as exc:
        raise InputFileError(meta_path, f"cannot be read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "rh3dgs-scene":
        raise InputFileError(meta_path, "is not an rh3dgs scene description", field="format")
    ply_path = _scene_file(meta_path, meta, "ply", "semantic.ply", required=True)
    field_path = _scene_file(meta_path, meta, "field")
    transforms_path = _scene_file(meta_path, meta, "transforms")
    g = load_ply(ply_path, device=device)
    fld, arrays = None, None
    if field_path is not None:
        arrays = _read_field_npz(field_path)
        if "decoder" not in arrays:
            raise InputFileError(field_path, "has no 'decoder' array", field="decoder")
        if g.latents is None:
            raise InputFileError(ply_path, "has no sem_* latents but the scene has a field")
        dec_np = _field_array(field_path, arrays, "decoder", 2)
        if dec_np.shape[1] != g.latents.shape[1] or dec_np.shape[0] == 0:
            raise InputFileError(field_path, f"decoder shape {list(dec_np.shape)} does not match "
                                             f"{g.latents.shape[1]} latents", field="decoder")
        dec = torch.from_numpy(dec_np.astype(np.float32)).to(device)
        valid = None
        if "valid" in arrays:
            v = _field_array(field_path, arrays, "valid", 1, kinds="biu")
            if v.shape[0] != len(g):
                raise InputFileError(field_path, f"has {v.shape[0]} entries for {len(g)} Gaussians", field="valid")
            valid = torch.from_numpy(v.astype(bool)).to(device)
        if ("text_names" in arrays) != ("text_vectors" in arrays):
            raise InputFileError(field_path, "text_names and text_vectors must be stored together", field="text_names")
        if "text_names" in arrays:
            names = _field_array(field_path, arrays, "text_names", 1, kinds="U")
            vecs = _field_array(field_path, arrays, "text_vectors", 2)
            if vecs.shape != (names.shape[0], dec_np.shape[0]):
                raise InputFileError(field_path, f"shape {list(vecs.shape)} does not match {names.shape[0]} names "
                                                 f"x D={dec_np.shape[0]}", field="text_vectors")
            arrays["text_vectors"] = vecs.astype(np.float32)
        fld = SemanticField(g.latents, dec, valid)
    cams = None
    if transforms_path is not None:
        cams, _ = load_transforms(transforms_path, check_images=False, require_images=False)
    spec = meta.get("teacher")
    if spec is not None and spec != {} and not isinstance(spec, dict):
        raise InputFileError(meta_path, f"must be an object {{\"name\": ...}} or null, got {json.dumps(spec)[:60]}",
                             field="teacher")
    try:
        encoder = _text_encoder_from(meta, folder, arrays)
    except (InputFileError, MissingWeightsError):  # these name their file already
        raise
    except (ConfigError, TypeError, ValueError) as exc:
        raise InputFileError(meta_path, f"cannot build the teacher it names ({type(exc).__name__}: {exc})",
                             field="teacher") from None
    return Scene(g, fld, cams, text_encoder=encoder, path=folder)
