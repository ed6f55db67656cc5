"""The background thread that owns the probe's file.

The training loop only puts work on a queue; JSON encoding, waiting for
asynchronous copies and disk writes happen here, so a slow or full disk
delays records, never steps. Each batch is written with one write() and
flushed, so the daemon's tailer sees whole lines as soon as they exist.

The file is opened for appending: a resumed run adds a new meta record and
continues in the same file, as the daemon expects of a log.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsentry_probe.transfer import Batch, Row

log = logging.getLogger("trainsentry_probe")

_STOP = object()


def dumps(record: dict[str, Any]) -> str:
    """One line; NaN/Infinity as Python's json writes them (the daemon reads those)."""
    return json.dumps(record, separators=(",", ":"), default=str)


class RecordWriter:
    """Writes a meta record, then the records of each batch put on its queue."""

    def __init__(
        self,
        path: Path,
        meta: Callable[[], dict[str, Any]],
        render: Callable[[Row, dict[str, list[float]]], dict[str, Any]],
    ) -> None:
        self.path = path
        self._meta = meta
        self._render = render
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.written = 0
        self.errors = 0
        self._thread = threading.Thread(
            target=self._run, name="trainsentry-probe-writer", daemon=True
        )
        self._thread.start()

    def put(self, item: Batch | dict[str, Any]) -> None:
        self._queue.put(item)

    def close(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then stops; waits at most `timeout` seconds."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _lines(self, item: Batch | dict[str, Any]) -> list[str]:
        if isinstance(item, Batch):
            return [
                dumps(self._render(row, values))
                for row, values in zip(item.rows, item.values(), strict=True)
            ]
        return [dumps(item)]

    def _run(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            log.warning("trainsentry probe: cannot write %s, recording nothing: %s", self.path, exc)
            while self._queue.get() is not _STOP:  # drain, so memory does not grow
                self.errors += 1
            return
        with out:
            try:
                out.write(dumps(self._meta()) + "\n")
                out.flush()
            except Exception as exc:
                self.errors += 1
                log.warning("trainsentry probe: meta record not written: %s", exc)
            while True:
                item = self._queue.get()
                if item is _STOP:
                    break
                try:
                    lines = self._lines(item)
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                    self.written += len(lines)
                except Exception as exc:  # one bad batch must not end the file
                    self.errors += 1
                    log.warning("trainsentry probe: records dropped: %s", exc)
