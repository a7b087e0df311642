"""Loading of the compiled extension ``rh3dgs._C`` (never compiled at import or run time)."""
from __future__ import annotations

import functools

import torch

from ..errors import NativeExtensionError

__all__ = ["native_ops", "has_native_kernel"]


@functools.lru_cache(maxsize=None)
def native_ops():
    """Return ``torch.ops.rh3dgs`` after loading the prebuilt extension.

    Raises :class:`NativeExtensionError` with the fix when the extension is missing.
    """
    try:
        from .. import _C  # noqa: F401  (registers torch.ops.rh3dgs.*)
    except ImportError as exc:  # pragma: no cover - exercised only on broken installs
        raise NativeExtensionError(
            "the rh3dgs native extension (rh3dgs._C) is not built or does not match this torch "
            f"({torch.__version__}): run `make install` or `pip install --no-build-isolation -e .` "
            f"in the rh3dgs checkout. Import error: {exc}"
        ) from exc
    return torch.ops.rh3dgs


def has_native_kernel(op: str, device: torch.device) -> bool:
    """Whether ``torch.ops.rh3dgs.<op>`` has a kernel for ``device`` (CPU always; CUDA when built)."""
    native_ops()
    key = "CUDA" if torch.device(device).type == "cuda" else "CPU"
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"rh3dgs::{op}", key)
