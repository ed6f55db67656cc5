"""Data sets the benchmarks write once and keep in bench/.cache/.

Written into a `.partial` directory and renamed when complete, so a run
interrupted while writing (minutes for a large set) leaves nothing that a
later run would take for the finished set.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

CACHE = Path(__file__).parent / ".cache"


def cached(name: str, write: Callable[[Path], None], what: str) -> Path:
    """The directory `name` under the cache, written by `write(directory)` the first time."""
    target = CACHE / name
    if target.exists():
        return target
    partial = CACHE / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"writing {what} (once) ...", flush=True)
    write(partial)
    partial.rename(target)
    return target
