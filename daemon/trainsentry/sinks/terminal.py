"""Alert transitions for a person watching the terminal, and for a file other tools tail.

On a terminal the alerts are drawn by console.py (coloured by severity,
resolves dimmed); anywhere else they are the plain `replay` timeline lines.

Both skip history: when the daemon starts on a directory of old runs, it must
evaluate them to know their state, but telling someone that a run finished
last month had a loss spike is noise. Transitions older than the horizon
(measured from the daemon's start, on the data's own wall time) are counted,
not shown — except the resolves of alerts whose firing was shown (`told`),
perhaps by the daemon's previous life: a firing line is always ended.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from trainsentry.replay import format_text
from trainsentry.rules.lifecycle import Transition
from trainsentry.shutdown import signals_deferred
from trainsentry.sinks import console


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
        self._rich = console.console_for(out) if console.is_rich(out) else None
        self._jsonl = jsonl_path.open("a", encoding="utf-8") if jsonl_path else None

    def __call__(
        self, transitions: list[Transition], told: frozenset[tuple[str, str, str]] = frozenset()
    ) -> None:
        """`told`: keys of alerts shown firing, whose resolves are shown however old."""
        shown = [
            t
            for t in transitions
            if not t.wall_time < self.since or (t.state == "resolved" and t.key in told)
        ]  # NaN (no time) is shown
        self.hidden += len(transitions) - len(shown)
        if not shown:
            return
        with signals_deferred():
            if self._rich is not None:
                console.print_alerts(self._rich, shown)
            else:
                self._out.write("".join(format_text(t) + "\n" for t in shown))
                self._out.flush()
            if self._jsonl is not None:
                self._jsonl.write(
                    "".join(json.dumps(t.as_dict(), ensure_ascii=False) + "\n" for t in shown)
                )
                self._jsonl.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
