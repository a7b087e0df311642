"""Small files that claim to be big: what a reader must refuse from its headers, before it allocates."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def inflating_npz(path: Path, member: str, shape, dtype, extra=None) -> Path:
    """An .npz whose member ``member`` is a compressed array of zeros of ``shape`` (a small file that inflates to
    the full array: what a zip bomb is); ``extra``: other members, written as they are."""
    import zipfile

    dtype = np.dtype(dtype)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in (extra or {}).items():
            with z.open(f"{k}.npy", "w") as f:
                np.lib.format.write_array(f, np.asarray(v))
        with z.open(f"{member}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": dtype.str, "fortran_order": False, "shape": shape})
            left, block = int(np.prod(shape)) * dtype.itemsize, bytes(1 << 22)
            while left > 0:
                f.write(block[:left])
                left -= len(block)
    return path


def png_claiming(path: Path, w: int, h: int) -> Path:
    """A PNG whose header claims w x h pixels (and holds almost no data): PIL reads the size lazily."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
    return path
