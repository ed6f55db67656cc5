"""Reading finished runs from start to end: the input of `dump` and `replay`.

The same FileTail as the live daemon, with no state kept, so a backtest reads
exactly what the daemon would have read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trainsentry.point import Point
from trainsentry.sources.discover import roots
from trainsentry.sources.tail import FileTail


def iter_batches(
    paths: Iterable[str | Path], on_error: Callable[[str], None] | None = None
) -> Iterator[list[Point]]:
    """Batches of points, file by file in sorted order, each file to its end.

    Raises FileNotFoundError for a path that does not exist: a typo on the
    command line deserves a clear error, not an empty result.
    """
    given = list(paths)
    for raw in given:
        if not Path(raw).exists():
            raise FileNotFoundError(f"no such file or directory: {raw}")
    for root in roots(given, replay=True):
        for log in root.scan():
            tail = FileTail(log)
            try:
                while True:
                    got = tail.read()
                    if on_error is not None:
                        for err in got.errors:
                            on_error(err)
                    if got.points:
                        yield got.points
                    if not got.more:
                        break
            finally:
                tail.close()


def iter_points(
    paths: Iterable[str | Path], on_error: Callable[[str], None] | None = None
) -> Iterator[Point]:
    for batch in iter_batches(paths, on_error):
        yield from batch
