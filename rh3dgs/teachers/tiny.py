"""``"tiny-clip"``: a tiny, random-initialised open_clip ViT for tests and demos.

It is a real open_clip ``CLIP`` model (registered once as ``rh3dgs-tiny-vit`` through
``open_clip.add_model_config``), so it exercises exactly the dense-feature code of
:class:`~rh3dgs.teachers.clip.ClipTeacher`; only the weights are random (seeded, hence
deterministic across runs and machines with the same torch version). Its features carry
no semantics: **its answers to text queries are random** (the pipeline's tests use it), and building it
warns so once per process (:class:`RandomTeacherWarning`). No download ever happens.

Architecture: embed_dim 32; vision 64 px input, patch 8 (8 x 8 grid), 2 layers, width 64,
2 heads; text context 16, vocab 49408 (open_clip's BPE tokenizer), width 32, 2 heads, 1 layer.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Dict

import torch

from ..io.atomic import atomic_save_text
from .clip import ClipTeacher, import_open_clip

__all__ = ["TINY_MODEL_NAME", "TINY_MODEL_CONFIG", "register_tiny_config", "create_tiny_model", "TinyClipTeacher",
           "RandomTeacherWarning"]

TINY_MODEL_NAME = "rh3dgs-tiny-vit"
TINY_MODEL_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
_LOCK = threading.Lock()
_WARNED = False


class RandomTeacherWarning(UserWarning):
    """A teacher whose answers carry no meaning (``tiny-clip``: random weights)."""


def _warn_random() -> None:
    global _WARNED
    if _WARNED:
        return
    _WARNED = True
    warnings.warn("tiny-clip is a random-initialised model for pipeline tests: its features and its answers to text "
                  "queries are random. For meaningful answers offline use --teacher clip with local weights "
                  "(--checkpoint ViT-B-16.bin) or your own maps (--teacher precomputed)", RandomTeacherWarning,
                  stacklevel=3)


def register_tiny_config() -> str:
    """Register the tiny config with open_clip (idempotent); returns its model name.

    ``open_clip.add_model_config`` takes a JSON file path; the file is written once to
    ``<tmp>/rh3dgs-open-clip-configs/rh3dgs-tiny-vit.json``.
    """
    oc = import_open_clip()
    with _LOCK:
        if TINY_MODEL_NAME in oc.list_models():
            return TINY_MODEL_NAME
        folder = Path(os.environ.get("RH3DGS_TMP", tempfile.gettempdir())) / "rh3dgs-open-clip-configs"
        path = folder / f"{TINY_MODEL_NAME}.json"
        text = json.dumps(TINY_MODEL_CONFIG, indent=2, sort_keys=True) + "\n"
        try:
            current = path.read_text() if path.is_file() else None
        except OSError:
            current = None
        if current != text:
            atomic_save_text(path, text)
        oc.add_model_config(path)
    return TINY_MODEL_NAME


def create_tiny_model(seed: int = 0) -> torch.nn.Module:
    """The tiny open_clip model with weights drawn from ``torch.manual_seed(seed)``.

    The global RNG state is left untouched (``torch.random.fork_rng``).
    """
    oc = import_open_clip()
    name = register_tiny_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = oc.create_model(name, pretrained=None, device="cpu")
    return model.eval()


class TinyClipTeacher(ClipTeacher):
    """The CLIP teacher on the tiny random model (``make_teacher("tiny-clip", seed=0)``)."""

    name = "tiny-clip"

    def __init__(self, seed: int = 0, device: Any = "cpu", **kwargs: Any) -> None:
        self.seed = int(seed)
        for k in ("model", "pretrained", "checkpoint", "model_obj", "weights_id"):
            if k in kwargs:
                raise TypeError(f"tiny-clip got an unexpected keyword argument {k!r}")
        super().__init__(model=TINY_MODEL_NAME, pretrained=None, device=device,
                         model_obj=create_tiny_model(self.seed), weights_id=f"random-seed:{self.seed}",
                         **kwargs)
        _warn_random()

    @classmethod
    def kwargs_from_config(cls, config: Any, data_dir: Any = None) -> Dict[str, Any]:
        return dict(seed=config.seed, **cls._dense_kwargs(config))
