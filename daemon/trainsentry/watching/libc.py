"""The C library, for the calls Python does not wrap (inotify, malloc_trim).

`CDLL(None)` is the running process's own symbols, libc among them: no
library search (ctypes.util.find_library runs ldconfig) and one handle for
every caller. None where the platform has no dynamic loader to ask.
"""

from __future__ import annotations

import ctypes

try:
    LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    LIBC = None
