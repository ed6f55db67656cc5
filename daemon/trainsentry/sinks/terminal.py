"""Alert transitions for a person watching the terminal, and for a file other tools tail.

Both skip history: when the daemon starts on a directory of old runs, it must
evaluate them to know their state, but telling someone that a run finished
last month had a loss spike is noise. Transitions older than the horizon
(measured from the daemon's start, on the data's own wall time) are counted,
not shown.
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
        self._jsonl = jsonl_path.open("a", encoding="utf-8") if jsonl_path else None

    def __call__(self, transitions: list[Transition]) -> None:
        if transitions:
            with signals_deferred():
                self._write(transitions)

    def _write(self, transitions: list[Transition]) -> None:
        for t in transitions:
            if t.wall_time < self.since:  # NaN (no time) is shown
                self.hidden += 1
                continue
            line = format_text(t)
            if self._colour:
                key = "resolved" if t.state == "resolved" else t.severity
                line = COLOURS.get(key, "") + line + RESET
            self._out.write(line + "\n")
            if self._jsonl is not None:
                self._jsonl.write(json.dumps(t.as_dict(), ensure_ascii=False) + "\n")
        self._out.flush()
        if self._jsonl is not None:
            self._jsonl.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
