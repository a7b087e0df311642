"""What ``numpy.load`` can raise on a corrupt or hostile .npy / .npz (for readers to turn into our errors)."""
from __future__ import annotations

import tokenize
import zipfile
import zlib

# np.load parses the .npy header with ast.literal_eval (SyntaxError, tokenize.TokenError,
# MemoryError on huge shapes), reads with EOFError / ValueError on truncation, and opens
# .npz files as zip archives (BadZipFile, zlib.error, KeyError).
NPY_READ_ERRORS = (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile, zlib.error,
                   MemoryError, KeyError, TypeError, OverflowError)

__all__ = ["NPY_READ_ERRORS"]
