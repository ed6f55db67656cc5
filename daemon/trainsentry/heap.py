"""Hands memory the process freed back to the OS, where the C library keeps it.

A snapshot of a large fleet's alert state is a pickle of tens of megabytes,
built and freed every minute. glibc raises its mmap and trim thresholds
after the first large free (up to 32 and 64 MB), so later buffers of that
size come from the heap and stay there once freed: RSS that nobody uses,
about 40 MB in bench/load.py's soak. malloc_trim(0) returns it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _trim = getattr(_libc, "malloc_trim", None)  # glibc only (not musl)
    except OSError:
        _trim = None


def trim() -> None:
    if _trim is not None:
        _trim(0)
