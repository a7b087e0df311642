"""open_clip teacher: MaskCLIP-style dense per-patch CLIP embeddings (+ optional crop pyramid).

Dense path (exact choice, written down because papers differ)
------------------------------------------------------------
For an open_clip ``VisionTransformer`` (``conv1``, ``class_embedding``,
``positional_embedding``, ``ln_pre``, ``transformer.resblocks`` with
``attn = nn.MultiheadAttention``, ``ln_post``, ``proj``):

1. patchify with ``conv1``, prepend the class token, add the positional embedding
   (bicubically interpolated to the patch grid when it is not the native one - the
   class position is kept as is), ``ln_pre``;
2. run every block but the last unchanged;
3. in the last block, skip the query/key attention: the attention output of every
   token is the *value* projection of that token alone, ``a = out_proj(W_v ln_1(x) + b_v)``.
   With ``dense_path="maskclip"`` (default) the block is otherwise kept as MaskCLIP
   (Zhou et al., ECCV 2022) does: ``x' = x + ls_1(a)``, ``x'' = x' + ls_2(mlp(ln_2(x')))``
   (residual and MLP kept). With ``dense_path="value-only"`` the block output is ``a``
   itself (residual and MLP skipped, as later training-free work suggests);
4. ``ln_post`` and the visual projection ``proj`` on every *patch* token, L2-normalise
   -> ``[B, h, w, D]`` with ``h = H'/patch``, ``w = W'/patch``.

The global image embedding (``model.encode_image``) is untouched: nothing of the model
is patched or modified; the dense pass reuses its modules read-only.

Resolution: the image is resized (bilinear, antialiased) so that its short side is
``image_size`` (default: the model's native input size, 224 for ViT-B-16), keeping
the aspect ratio, each side rounded to a multiple of the patch size. Normalisation uses
the mean/std of the model's preprocessing config (OpenAI CLIP's mean/std for every
OpenAI / LAION ViT-B-16 checkpoint).

Multi-scale crop pyramid (LERF-style, optional)
-----------------------------------------------
``scales`` lists crop sizes as fractions of the image's short side. A scale ``>= 1``
stands for the dense map above. A scale ``s < 1`` tiles the image into square crops of
side ``s * min(H, W)`` with stride ``(1 - crop_overlap) * side`` (the last row /
column is shifted to touch the border, so the tiling covers the image), resizes every
crop to the model's native input size, encodes its *global* embedding with
``model.encode_image`` and splats it onto every cell of the output grid whose centre
lies in the crop; cells covered by several crops take the mean, then are normalised.
The maps of all scales (each unit) are averaged and normalised again. Our field has no
scale input (LERF's has), so averaging across scales is the way to use a pyramid.

Weights
-------
``pretrained`` is an open_clip tag (downloaded by open_clip into its cache on a
networked machine) or a local file; ``checkpoint`` a local state-dict file, which wins.
Without usable weights :class:`~rh3dgs.errors.MissingWeightsError` says what was asked
and how to fix it. Nothing is downloaded by rh3dgs itself.
"""
from __future__ import annotations

import hashlib
import math
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError, MissingWeightsError, ShapeError
from .base import Teacher, _stable_json, check_images, resolve_device

__all__ = ["ClipTeacher", "import_open_clip", "DENSE_PATHS", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD"]

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DENSE_PATHS = ("maskclip", "value-only")
_ALGO_VERSION = "clip-dense-v1"  # bump when the dense computation changes (invalidates caches)


def import_open_clip():
    """Import open_clip quietly (its import emits a torch.jit deprecation warning) and without wandb.

    open_clip imports timm, whose ``timm.utils.summary`` tries ``import wandb`` for its training-log helper
    (never used here): with wandb installed (nerfstudio pulls it in) that costs ~2.5 s of every command that
    builds a CLIP teacher. While open_clip is first imported, ``wandb`` is made unimportable (timm then takes
    it as absent, its documented fallback); the block is lifted right after, so a later ``import wandb``
    (``ns-train --vis wandb``) works as usual. A wandb imported before is left alone.
    """
    import sys

    block = "wandb" not in sys.modules
    if block:
        sys.modules["wandb"] = None  # type: ignore[assignment]  # import wandb -> ImportError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            import open_clip  # noqa: WPS433
    finally:
        if block and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]
    return open_clip


def _fix_hint(model: str) -> str:
    return (f"download the weights on a networked machine (python -c \"import open_clip; "
            f"open_clip.create_model_and_transforms('{model}', pretrained='<tag>')\" fills open_clip's "
            f"cache, or fetch the checkpoint file) and pass it with --checkpoint <file> "
            f"(TeacherConfig.checkpoint)")


def _file_fingerprint(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


class ClipTeacher(Teacher):
    """Dense CLIP teacher on an open_clip ViT.

    Args:
        model: open_clip architecture name (``"ViT-B-16"``).
        pretrained: open_clip pretrained tag or a local weights path; used when
            ``checkpoint`` is ``None``.
        checkpoint: local state-dict file for ``model`` (wins over ``pretrained``).
        image_size: short side fed to the ViT; ``None`` = the model's native size.
        scales: crop-pyramid scales (``(1.0,)``: dense map only); see module docs.
        crop_overlap: overlap of neighbouring pyramid crops, in [0, 1).
        dense_path: ``"maskclip"`` or ``"value-only"`` (see module docs).
        device: ``"auto"`` / ``None`` (CUDA if available), ``"cpu"``, ``"cuda:1"``...
        batch_size: crops per forward pass in the pyramid.
        download_dir: open_clip's download cache folder (``cache_dir`` of open_clip).
        model_obj: an already built open_clip ``CLIP`` model (used by the tiny test
            teacher); then ``pretrained`` / ``checkpoint`` are ignored.
        weights_id: identifies ``model_obj``'s weights in :meth:`cache_key`.
    """

    name = "clip"

    def __init__(
        self,
        model: str = "ViT-B-16",
        pretrained: Optional[str] = "laion2b_s34b_b88k",
        checkpoint: Optional[Union[str, Path]] = None,
        image_size: Optional[int] = None,
        scales: Sequence[float] = (1.0,),
        crop_overlap: float = 0.5,
        dense_path: str = "maskclip",
        device: Union[str, torch.device, None] = "auto",
        batch_size: int = 64,
        download_dir: Optional[str] = None,
        model_obj: Optional[nn.Module] = None,
        weights_id: Optional[str] = None,
    ) -> None:
        self.model_name = str(model)
        self.device = resolve_device(device)
        self.scales = tuple(float(s) for s in scales)
        if not self.scales or any(not math.isfinite(s) or s <= 0 for s in self.scales):
            raise ConfigError(f"teacher scales must be a non-empty list of positive numbers, got {scales!r}")
        if not (0.0 <= float(crop_overlap) < 1.0):
            raise ConfigError(f"crop_overlap must be in [0, 1), got {crop_overlap!r}")
        self.crop_overlap = float(crop_overlap)
        if dense_path not in DENSE_PATHS:
            raise ConfigError(f"dense_path must be one of {DENSE_PATHS}, got {dense_path!r}")
        self.dense_path = dense_path
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size!r}")
        self.batch_size = int(batch_size)

        self._open_clip = import_open_clip()
        if model_obj is not None:
            self.model = model_obj
            self.weights_id = weights_id or "in-memory"
        else:
            self.model, self.weights_id = self._load(pretrained, checkpoint, download_dir)
        self.model = self.model.to(self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

        visual = getattr(self.model, "visual", None)
        needed = ("conv1", "class_embedding", "positional_embedding", "ln_pre", "transformer",
                  "ln_post", "proj")
        if visual is None or any(not hasattr(visual, a) for a in needed) or visual.proj is None:
            raise ConfigError(f"open_clip model {self.model_name!r} has no ViT image tower with "
                              "conv1 / positional_embedding / ln_post / proj; dense CLIP features need "
                              "a ViT model such as ViT-B-16")
        if getattr(visual, "attn_pool", None) is not None:
            raise ConfigError(f"open_clip model {self.model_name!r} uses attentional pooling; "
                              "the MaskCLIP dense path needs a plain ViT (e.g. ViT-B-16)")
        last = visual.transformer.resblocks[-1]
        if not isinstance(getattr(last, "attn", None), nn.MultiheadAttention):
            raise ConfigError(f"open_clip model {self.model_name!r}: the last ViT block has no "
                              "nn.MultiheadAttention; unsupported for dense features")
        self.patch_size: Tuple[int, int] = tuple(int(p) for p in visual.conv1.kernel_size)  # type: ignore
        self.native_size: Tuple[int, int] = self._native_size(visual)
        self.image_size = int(image_size) if image_size is not None else min(self.native_size)
        if self.image_size < max(self.patch_size):
            raise ConfigError(f"image_size {self.image_size} is smaller than the patch size {self.patch_size}")
        mean = getattr(visual, "image_mean", None) or OPENAI_CLIP_MEAN
        std = getattr(visual, "image_std", None) or OPENAI_CLIP_STD
        self._mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self._dim = int(visual.proj.shape[1])
        self._tokenizer = None

    # ------------------------------------------------------------------ building
    @staticmethod
    def _dense_kwargs(config: Any) -> Dict[str, Any]:
        """The dense-path settings of a TeacherConfig (shared with the tiny teacher)."""
        return dict(image_size=config.image_size, scales=list(config.scales), crop_overlap=config.crop_overlap,
                    dense_path=config.dense_path, device=config.device, batch_size=config.batch_size)

    @classmethod
    def kwargs_from_config(cls, config: Any, data_dir: Any = None) -> Dict[str, Any]:
        return dict(model=config.model, pretrained=config.pretrained, checkpoint=config.checkpoint,
                    **cls._dense_kwargs(config))

    # ------------------------------------------------------------------ loading
    def _load(self, pretrained: Optional[str], checkpoint: Optional[Union[str, Path]],
              download_dir: Optional[str]) -> Tuple[nn.Module, str]:
        oc = self._open_clip
        name = self.model_name.replace("/", "-")
        self.model_name = name
        if name not in oc.list_models():
            raise ConfigError(f"unknown open_clip model {name!r}; e.g. ViT-B-16, ViT-L-14 "
                              f"({len(oc.list_models())} known: see open_clip.list_models())")
        if checkpoint is not None:
            path = Path(checkpoint).expanduser()
            if not path.is_file():
                raise MissingWeightsError(f"checkpoint file {path} for open_clip model {name} not found; "
                                          + _fix_hint(name))
            source, weights_id = str(path), f"file:{_file_fingerprint(path)}"
        elif pretrained:
            p = Path(str(pretrained)).expanduser()
            if p.is_file():
                source, weights_id = str(p), f"file:{_file_fingerprint(p)}"
            elif oc.is_pretrained_cfg(name, pretrained):
                source, weights_id = str(pretrained), f"tag:{pretrained}"
            else:
                tags = oc.list_pretrained_tags_by_model(name)
                raise MissingWeightsError(
                    f"pretrained weights {pretrained!r} for open_clip model {name} are neither a known tag "
                    f"(known: {', '.join(tags) or 'none'}) nor an existing file; " + _fix_hint(name))
        else:
            raise MissingWeightsError(f"no weights given for open_clip model {name} (pretrained=None, "
                                      "checkpoint=None); " + _fix_hint(name))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, _, _ = oc.create_model_and_transforms(name, pretrained=source, device="cpu",
                                                             cache_dir=download_dir)
        except Exception as e:  # download failure (offline), corrupt file, wrong architecture...
            what = f"checkpoint {source}" if weights_id.startswith("file:") else f"pretrained tag {source!r}"
            raise MissingWeightsError(f"could not load {what} for open_clip model {name} "
                                      f"({type(e).__name__}: {e}); " + _fix_hint(name)) from e
        return model, weights_id

    @staticmethod
    def _native_size(visual: nn.Module) -> Tuple[int, int]:
        size = getattr(visual, "image_size", None)
        if size is None:
            gh, gw = visual.grid_size
            return gh * visual.conv1.kernel_size[0], gw * visual.conv1.kernel_size[1]
        if isinstance(size, int):
            return size, size
        return int(size[0]), int(size[1])

    # ------------------------------------------------------------------ interface
    @property
    def dim(self) -> int:
        return self._dim

    def cache_key(self) -> str:
        settings = dict(algo=_ALGO_VERSION, teacher=self.name, model=self.model_name, weights=self.weights_id,
                        image_size=self.image_size, scales=list(self.scales),
                        crop_overlap=self.crop_overlap if any(s < 1 for s in self.scales) else None,
                        dense_path=self.dense_path)
        digest = hashlib.sha256(_stable_json(settings).encode()).hexdigest()[:16]
        return f"{self.name}:{self.model_name}:{self.weights_id.split(':')[0]}:{digest}"

    def settings(self) -> Dict[str, Any]:
        """The settings that enter :meth:`cache_key`, for manifests / logs."""
        return dict(teacher=self.name, model=self.model_name, weights=self.weights_id,
                    image_size=self.image_size, scales=list(self.scales), crop_overlap=self.crop_overlap,
                    dense_path=self.dense_path)

    def grid_size(self, height: int, width: int) -> Tuple[int, int]:
        """Output map size ``(h, w)`` for an ``height x width`` image."""
        th, tw = self._target_size(height, width)
        return th // self.patch_size[0], tw // self.patch_size[1]

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1] -> ``[B, h, w, D]`` unit float32 (on the input's device)."""
        out_device = images.device if isinstance(images, torch.Tensor) else torch.device("cpu")
        images = check_images(images).to(self.device)
        H, W = images.shape[-2:]
        gh, gw = self.grid_size(H, W)
        acc = None
        for s in self.scales:
            fmap = self._dense(images) if s >= 1.0 else self._crop_scale(images, s, (gh, gw))
            acc = fmap if acc is None else acc + fmap
        assert acc is not None
        if len(self.scales) > 1:
            acc = F.normalize(acc, dim=-1)
        return acc.float().to(out_device)

    @torch.no_grad()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """``Q`` strings -> ``[Q, D]`` unit float32 on CPU (open_clip tokenizer + ``encode_text``)."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            return torch.zeros(0, self.dim)
        if self._tokenizer is None:
            self._tokenizer = self._open_clip.get_tokenizer(self.model_name)
        tokens = self._tokenizer(texts).to(self.device)
        return self.model.encode_text(tokens, normalize=True).float().cpu()

    @torch.no_grad()
    def encode_global(self, images: torch.Tensor) -> torch.Tensor:
        """Global CLIP image embeddings ``[B, D]`` (unit) via open_clip's ``encode_image``.

        Images are resized to the model's native input size (no crop); use square
        images to match open_clip's own preprocessing exactly.
        """
        out_device = images.device if isinstance(images, torch.Tensor) else torch.device("cpu")
        images = check_images(images).to(self.device)
        x = self._normalise(self._resize(images, self.native_size))
        return self._encode_global_normalised(x).to(out_device)

    # ------------------------------------------------------------------ internals
    def _target_size(self, height: int, width: int) -> Tuple[int, int]:
        ph, pw = self.patch_size
        short = min(height, width)
        th = self.image_size * height / short
        tw = self.image_size * width / short
        return max(ph, int(round(th / ph)) * ph), max(pw, int(round(tw / pw)) * pw)

    @staticmethod
    def _resize(images: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
        if tuple(images.shape[-2:]) == tuple(size):
            return images
        return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)

    def _normalise(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self._mean) / self._std

    def _cast(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.model.visual.conv1.weight.dtype)

    def _encode_global_normalised(self, x: torch.Tensor) -> torch.Tensor:
        out = [self.model.encode_image(self._cast(x[i:i + self.batch_size]), normalize=True)
               for i in range(0, x.shape[0], self.batch_size)]
        return torch.cat(out).float()

    def _pos_embed(self, gh: int, gw: int) -> torch.Tensor:
        visual = self.model.visual
        pos = visual.positional_embedding
        Gh, Gw = visual.grid_size
        if (gh, gw) == (Gh, Gw):
            return pos
        cls_pos, grid = pos[:1], pos[1:]
        width = grid.shape[-1]
        grid = grid.reshape(1, Gh, Gw, width).permute(0, 3, 1, 2).float()
        grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", align_corners=False)
        grid = grid.permute(0, 2, 3, 1).reshape(gh * gw, width).to(pos.dtype)
        return torch.cat([cls_pos, grid], dim=0)

    def _dense(self, images: torch.Tensor) -> torch.Tensor:
        """MaskCLIP dense map ``[B, h, w, D]`` of images in [0, 1] (any size)."""
        H, W = images.shape[-2:]
        x = self._cast(self._normalise(self._resize(images, self._target_size(H, W))))
        return self.dense_from_normalised(x)

    def dense_from_normalised(self, x: torch.Tensor) -> torch.Tensor:
        """The dense path on an already normalised batch ``[B, 3, H, W]`` (H, W multiples of the patch)."""
        visual = self.model.visual
        B = x.shape[0]
        if x.shape[-2] % self.patch_size[0] or x.shape[-1] % self.patch_size[1]:
            raise ShapeError(f"input size {tuple(x.shape[-2:])} is not a multiple of the patch size {self.patch_size}")
        tok = visual.conv1(x)  # [B, width, gh, gw]
        gh, gw = tok.shape[-2:]
        tok = tok.reshape(B, tok.shape[1], gh * gw).permute(0, 2, 1)
        cls = visual.class_embedding.to(tok.dtype).view(1, 1, -1).expand(B, -1, -1)
        tok = torch.cat([cls, tok], dim=1) + self._pos_embed(gh, gw).to(tok.dtype)
        tok = visual.ln_pre(tok)  # patch dropout is the identity in eval mode: skipped

        tr = visual.transformer
        batch_first = getattr(tr, "batch_first", True)
        blocks = tr.resblocks
        if not batch_first:
            tok = tok.transpose(0, 1)
        for blk in blocks[:-1]:
            tok = blk(tok)
        if not batch_first:
            tok = tok.transpose(0, 1)
        tok = self._last_block_value_path(blocks[-1], tok)  # [B, 1 + gh*gw, width]

        patches = visual.ln_post(tok[:, 1:]) @ visual.proj
        return F.normalize(patches.float(), dim=-1).reshape(B, gh, gw, -1)

    def _last_block_value_path(self, blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
        attn: nn.MultiheadAttention = blk.attn
        E = attn.embed_dim
        if attn.in_proj_weight is not None:
            w_v = attn.in_proj_weight[2 * E:]
        else:  # separate q/k/v projections (kdim/vdim != embed_dim)
            w_v = attn.v_proj_weight
        b_v = attn.in_proj_bias[2 * E:] if attn.in_proj_bias is not None else None
        v = F.linear(blk.ln_1(x), w_v, b_v)
        a = attn.out_proj(v)
        if self.dense_path == "value-only":
            return a
        ls_1 = getattr(blk, "ls_1", nn.Identity())
        ls_2 = getattr(blk, "ls_2", nn.Identity())
        x = x + ls_1(a)
        return x + ls_2(blk.mlp(blk.ln_2(x)))

    # crop pyramid ----------------------------------------------------------
    @staticmethod
    def _starts(length: int, crop: int, stride: int) -> List[int]:
        if crop >= length:
            return [0]
        starts = list(range(0, length - crop + 1, stride))
        if starts[-1] != length - crop:
            starts.append(length - crop)
        return starts

    def _crop_scale(self, images: torch.Tensor, scale: float, grid: Tuple[int, int]) -> torch.Tensor:
        """Global embeddings of square crops of side ``scale * short side``, splatted onto ``grid``."""
        B, _, H, W = images.shape
        gh, gw = grid
        crop = max(1, int(round(scale * min(H, W))))
        stride = max(1, int(round(crop * (1.0 - self.crop_overlap))))
        ys, xs = self._starts(H, crop, stride), self._starts(W, crop, stride)
        boxes = [(y, x) for y in ys for x in xs]
        dev = images.device
        yc = (torch.arange(gh, device=dev, dtype=torch.float32) + 0.5) * (H / gh)
        xc = (torch.arange(gw, device=dev, dtype=torch.float32) + 0.5) * (W / gw)
        y0 = torch.tensor([b[0] for b in boxes], device=dev, dtype=torch.float32)
        x0 = torch.tensor([b[1] for b in boxes], device=dev, dtype=torch.float32)
        rows = (yc[None] >= y0[:, None]) & (yc[None] < y0[:, None] + crop)  # [N, gh]
        cols = (xc[None] >= x0[:, None]) & (xc[None] < x0[:, None] + crop)  # [N, gw]
        cover = (rows[:, :, None] & cols[:, None, :]).float()  # [N, gh, gw]
        count = cover.sum(0).clamp_min(1.0)

        out = torch.zeros(B, gh, gw, self.dim, device=dev)
        for b in range(B):
            emb_parts = []
            for i in range(0, len(boxes), self.batch_size):
                chunk = boxes[i:i + self.batch_size]
                crops = torch.stack([images[b, :, y:y + crop, x:x + crop] for y, x in chunk])
                crops = self._normalise(self._resize(crops, self.native_size))
                emb_parts.append(self._encode_global_normalised(crops))
            emb = torch.cat(emb_parts)  # [N, D]
            out[b] = torch.einsum("nhw,nd->hwd", cover, emb) / count[..., None]
        return F.normalize(out, dim=-1)
