"""Alert transitions for a person watching the terminal, and for a file other tools tail.

Both skip history: when the daemon starts on a directory of old runs, it must
evaluate them to know their state, but telling someone that a run finished
last month had a loss spike is noise. Transitions older than the horizon
(measured from the daemon's start, on the data's own wall time) are counted,
not shown.

A full disk under the JSONL file must not stop the terminal lines: a failed
append is said once (and its recovery once), the lines of that batch are
counted as lost, and the next batch tries again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from trainsentry.replay import format_text
from trainsentry.rules.lifecycle import Transition
from trainsentry.shutdown import signals_deferred

COLOURS = {"critical": "\033[1;31m", "warning": "\033[33m", "resolved": "\033[32m"}
RESET = "\033[0m"


class AlertPrinter:
    def __init__(
        self,
        *,
        since: float,
        out: TextIO = sys.stdout,
        jsonl_path: Path | None = None,
    ) -> None:
        self.since = since
        self.hidden = 0
        self._out = out
        self._colour = out.isatty()
        self._jsonl_path = jsonl_path
        # unbuffered: a failed write leaves nothing in a buffer to be written twice later
        self._jsonl = jsonl_path.open("ab", buffering=0) if jsonl_path else None
        self.jsonl_lost = 0  # transitions not appended since appends last worked

    def __call__(self, transitions: list[Transition]) -> None:
        if transitions:
            with signals_deferred():
                self._write(transitions)

    def _write(self, transitions: list[Transition]) -> None:
        records: list[str] = []
        for t in transitions:
            if t.wall_time < self.since:  # NaN (no time) is shown
                self.hidden += 1
                continue
            line = format_text(t)
            if self._colour:
                key = "resolved" if t.state == "resolved" else t.severity
                line = COLOURS.get(key, "") + line + RESET
            self._out.write(line + "\n")
            records.append(json.dumps(t.as_dict(), ensure_ascii=False) + "\n")
        self._out.flush()
        if self._jsonl is not None and records:
            self._append("".join(records).encode(), len(records))

    def _append(self, data: bytes, count: int) -> None:
        assert self._jsonl is not None
        try:
            view = memoryview(data)
            while view:
                view = view[self._jsonl.write(view) or 0 :]
        except OSError as exc:
            if not self.jsonl_lost:
                print(
                    f"trainsentry: cannot append to {self._jsonl_path}: {exc}; "
                    "alerts still go to the terminal and the receivers",
                    file=sys.stderr,
                    flush=True,
                )
            self.jsonl_lost += count
            return
        if self.jsonl_lost:
            print(
                f"trainsentry: appending to {self._jsonl_path} again; "
                f"{self.jsonl_lost} transition(s) could not be written",
                file=sys.stderr,
                flush=True,
            )
            self.jsonl_lost = 0

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
