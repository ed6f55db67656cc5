"""Alert transitions for a person watching the terminal, and for a file other tools tail.

On a terminal the alerts are drawn by console.py (coloured by severity,
resolves dimmed); anywhere else they are the plain `replay` timeline lines.

Both skip history: when the daemon starts on a directory of old runs, it must
evaluate them to know their state, but telling someone that a run finished
last month had a loss spike is noise. Transitions older than the horizon
(measured from the daemon's start, on the data's own wall time) are counted,
not shown — except the resolves of alerts whose firing was shown (`told`),
perhaps by the daemon's previous life: a firing line is always ended.

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
        self._jsonl_path = jsonl_path
        # unbuffered: a failed write leaves nothing in a buffer to be written twice later
        self._jsonl = jsonl_path.open("ab", buffering=0) if jsonl_path else None
        self.jsonl_lost = 0  # transitions not appended since appends last worked

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
                text = "".join(json.dumps(t.as_dict(), ensure_ascii=False) + "\n" for t in shown)
                self._append(text.encode(), len(shown))

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
