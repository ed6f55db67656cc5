"""Alert transitions for a person watching the terminal (and `--alerts-jsonl` beside it).

On a terminal the alerts are drawn by console.py (coloured by severity,
resolves dimmed); anywhere else they are the plain `replay` timeline lines.

Both skip history: when the daemon starts on a directory of old runs, it must
evaluate them to know their state, but telling someone that a run finished
last month had a loss spike is noise. Transitions older than the horizon
(measured from the daemon's start, on the data's own wall time) are counted,
not shown — except the resolves of alerts whose firing was shown (`told`),
perhaps by the daemon's previous life: a firing line is always ended.

The same transitions go to `--alerts-jsonl` (sinks/alert_log.py), so the file
and the screen never disagree about what was shown.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from trainsentry.alert import AlertKey, Transition, went_quiet
from trainsentry.jobs import same_job
from trainsentry.sinks.alert_log import AlertLog
from trainsentry.stop_signals import signals_deferred
from trainsentry.terminal import render as console
from trainsentry.terminal.plain import format_text


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
        self._log = AlertLog(jsonl_path) if jsonl_path else None
        # per run, the alerts shown firing and the first of them: the incident they make
        self._open: dict[str, dict[AlertKey, tuple[str, int]]] = {}

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
        notes = [self._incident(t) for t in shown]
        self._close_recovered(shown)
        with signals_deferred():
            if self._rich is not None:
                console.print_alerts(self._rich, shown, notes)
            else:
                text = "".join(format_text(t, n) + "\n" for t, n in zip(shown, notes, strict=True))
                self._out.write(text)
                self._out.flush()
            if self._log is not None:
                self._log.append(shown)

    def _incident(self, t: Transition) -> str:
        """What a firing adds to its run's incident, as the receivers get it: a firing
        while others of the run fire joins the incident they opened (the notifier sends
        it as an update, not a page of its own)."""
        if t.state == "resolved":
            if not went_quiet(t.reason):
                self._close(t)
            return ""
        run = self._open.setdefault(t.run, {})
        others = [
            v
            for r, alerts in self._open.items()
            if same_job(r, t.run)
            for k, v in alerts.items()
            if k != t.key
        ]
        run.setdefault(t.key, (t.rule, t.step))
        if not others or t.escalated_from:
            return ""
        rule, step = others[0]
        return f"joins the incident opened by {rule} at step {step}"

    def _close_recovered(self, shown: list[Transition]) -> None:
        """A resolve the data made ("recovered", "settled at ...") closes its part of the incident
        after the rest of its batch: an alert the same point fires (the loss under the
        critical's line, still over the warning's) joins the incident, as the notifier's
        held resolve has it."""
        last = {t.key: t for t in shown}  # a re-fire later in the batch keeps it open
        for t in last.values():
            if t.state == "resolved" and went_quiet(t.reason):
                self._close(t)

    def _close(self, t: Transition) -> None:
        run = self._open.get(t.run)
        if run is None:
            return
        run.pop(t.key, None)
        if not run:
            del self._open[t.run]

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
