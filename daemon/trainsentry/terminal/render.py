"""What a person at a terminal sees: alerts, the replay timeline, status, backfill progress.

Plain lines stay the default and a contract — journald, files, CI logs, grep
and users' scripts read them — so rich is used only when the stream is a
terminal, or with `--color always` (for `less -R`, `watch --color`).
`NO_COLOR` keeps the layout and drops the colour; `--color never` gives the
plain lines on a terminal too. The colour choice is a property of the process
(like NO_COLOR itself), so the CLI sets it once here and every writer asks.

All rich calls live in this module: the callers decide what to say, this
decides how it looks. rich is imported only when something is drawn, so the
plain paths (the daemon under systemd) never load it.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from trainsentry.alert import Transition
from trainsentry.stop_signals import signals_deferred

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.progress import Progress, TaskID

MODES = ("auto", "always", "never")
_mode = "auto"

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow"}


def set_color(mode: str) -> None:
    """`--color`: auto (rich on a terminal), always, never (plain lines everywhere)."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"unknown colour mode {mode!r}; expected one of {', '.join(MODES)}")
    _mode = mode


def is_rich(stream: TextIO) -> bool:
    """Whether `stream` gets the rich rendering instead of the plain lines."""
    if _mode != "auto":
        return _mode == "always"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real file
        return False
    return tty and os.environ.get("TERM") != "dumb"


def wants_colour(stream: TextIO) -> bool:
    return is_rich(stream) and (_mode == "always" or not os.environ.get("NO_COLOR"))


def console_for(stream: TextIO) -> Console:
    from rich.console import Console

    return Console(
        file=stream,
        force_terminal=True,  # is_rich already decided; rich must not second-guess a pty
        no_color=not wants_colour(stream),
        highlight=False,  # no guessing colours for numbers and paths in messages
        markup=False,  # rule names and messages may contain [brackets]
        emoji=False,
    )


def _when(wall_time: float, with_date: bool) -> str:
    """Local time, as a person at the terminal reads clocks; the date when it is not today."""
    if not wall_time > 0:  # NaN or unset: a point without a time
        return "-"
    day = time.strftime("%Y-%m-%d", time.localtime(wall_time))
    if with_date or day != time.strftime("%Y-%m-%d"):
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(wall_time))
    return time.strftime("%H:%M:%S", time.localtime(wall_time))


def transition_block(
    t: Transition,
    *,
    show_run: bool = True,
    with_date: bool = False,
    runbook: bool = True,
    when: str | None = None,
    width: int | None = None,
    note: str = "",
) -> RenderableType:
    """One transition: when, then a head (state, severity, run, rule, metric, step) and why.

    A two-column grid, so that everything after the time — the message, the
    runbook — hangs in the second column. On a terminal too narrow for the
    head (`width`, the console's), the metric and step go on a line of their
    own rather than breaking wherever the width ends ("step" on one line, its
    number on the next). A resolve is one dimmed row ending in its reason.
    """
    from rich.table import Table
    from rich.text import Text

    resolved = t.state == "resolved"
    state = "resolved" if resolved else "ESCALATED" if t.escalated_from else t.state.upper()
    quiet = "dim" if resolved else ""
    stamp = when or _when(t.wall_time, with_date)
    head = Text(overflow="fold")
    head.append(f"{state:<9} {t.severity:<8} ", style=quiet or SEVERITY_STYLE.get(t.severity, ""))
    if show_run:
        head.append(f"{t.run}  ", style=quiet or "cyan")
    head.append(t.rule, style=quiet or "bold")
    where = Text(f"{t.metric}  step {t.step}", style=quiet)
    if resolved:
        where.append(f"  ({t.reason or 'recovered'})", style="dim italic")
    room = None if width is None else width - len(stamp) - 2
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column(overflow="fold")
    if room is not None and len(head) + 2 + len(where) > room:
        grid.add_row(stamp, head)
        grid.add_row("", where)
    else:
        head.append("  ")
        head.append_text(where)
        grid.add_row(stamp, head)
    if resolved:
        return grid
    grid.add_row("", Text(t.message))
    if note:
        grid.add_row("", Text(note, style="dim italic"))
    if runbook and t.runbook:
        grid.add_row("", Text(f"runbook: {t.runbook}", style="dim"))
    return grid


def print_alerts(
    console: Console, transitions: Iterable[Transition], notes: Sequence[str] = ()
) -> None:
    """`run`'s live transitions, written above the backfill bar if one is drawn."""
    with signals_deferred():
        if _bar is not None:
            _bar.clear_line()
        for i, t in enumerate(transitions):
            note = notes[i] if i < len(notes) else ""
            console.print(transition_block(t, width=console.width, note=note))
        console.file.flush()


def print_text(console: Console, text: str, prefix: str = "") -> None:
    """A line of prose, wrapped at words to the terminal's width, hanging after `prefix`."""
    from rich.table import Table
    from rich.text import Text

    if not prefix:
        console.print(Text(text))
        return
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(prefix), Text(text))
    console.print(grid)


def print_replay(console: Console, transitions: Sequence[Transition]) -> None:
    """`replay --format text`: the transitions grouped per run, then a table of the runs."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    runs: dict[str, list[Transition]] = {}
    for t in transitions:
        runs.setdefault(t.run, []).append(t)
    for run, items in runs.items():
        console.print(Rule(Text(run, style="bold cyan"), align="left", style="dim"))
        shown: set[str] = set()  # a rule's runbook once per run, not at every firing
        for t in items:
            console.print(
                transition_block(
                    t,
                    show_run=False,
                    with_date=True,
                    runbook=t.rule not in shown,
                    width=console.width,
                )
            )
            if t.state == "firing":
                shown.add(t.rule)
        console.print()
    fired = [t for t in transitions if t.state == "firing"]
    if not fired:
        console.print(Text("no alerts", style="green"))
        return
    table = Table(
        title="summary", title_justify="left", box=None, header_style="bold", pad_edge=False
    )
    table.add_column("run", overflow="fold")
    table.add_column("fired", justify="right")
    table.add_column("warning at", justify="right", no_wrap=True)
    table.add_column("critical at", justify="right", no_wrap=True, style="red")
    table.add_column("rules", overflow="fold")  # one a line: a name is cut only if it must
    for run, items in runs.items():
        firing = [t for t in items if t.state == "firing"]
        first = {
            severity: next((f"step {t.step}" for t in firing if t.severity == severity), "-")
            for severity in ("warning", "critical")
        }
        rules = "\n".join(dict.fromkeys(t.rule for t in firing)) or "-"
        table.add_row(run, str(len(firing)), first["warning"], first["critical"], rules)
    console.print(table)
    console.print(Text(f"{len(fired)} firing transitions in {len(runs)} run(s)", style="bold"))


def print_status(
    console: Console,
    runs: Sequence[dict[str, Any]],
    alerts: Sequence[dict[str, Any]],
    dropped: int = 0,
) -> None:
    """`status`: a table of runs (last step, age of the last point, firing), then the alerts."""
    from rich.table import Table
    from rich.text import Text

    from trainsentry.terminal.plain import by_job, checkpoint_lines, format_age, summary_line

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("RUN", style="cyan", overflow="fold")
    table.add_column("STEP", justify="right")
    table.add_column("AGE", justify="right")
    table.add_column("FIRING", overflow="fold")
    for label, r in by_job(runs):
        if r is None:
            table.add_row(Text(label, style="bold"), "", "", "")
            continue
        firing = Text()
        for i, a in enumerate(r.get("firing") or []):
            severity = str(a.get("severity", ""))
            firing.append("\n" if i else "")
            firing.append(severity, style=SEVERITY_STYLE.get(severity, ""))
            firing.append(f" {a.get('rule')} ({a.get('metric')})")
        step = "-" if r.get("last_step") is None else str(r["last_step"])
        table.add_row(label, step, format_age(r.get("age_seconds")), firing or "-")
    console.print(table)
    console.print(Text(summary_line(runs, alerts, dropped), style="yellow" if dropped else "dim"))
    for line in checkpoint_lines(runs):
        console.print(Text(line, style="dim"))
    if not alerts:
        return
    console.print()
    listing = Table(box=None, show_header=False, pad_edge=False)
    listing.add_column(no_wrap=True)
    listing.add_column(style="cyan", no_wrap=True)
    listing.add_column(overflow="fold")
    for a in alerts:
        severity = str(a.get("severity", ""))
        what = Text(f"{a.get('rule')}", style="bold")
        what.append(": " + " ".join(str(a.get("message", "")).split()), style="")
        listing.add_row(
            Text(severity, style=SEVERITY_STYLE.get(severity, "")), str(a.get("run")), what
        )
    console.print(listing)


class BackfillBar:
    """The startup read of existing logs as a progress bar on a terminal.

    Refreshed only when the reporter calls (no rich refresh thread): every
    write to the terminal then happens on the main loop's thread with the stop
    signals deferred, and alerts printed meanwhile can clear the bar's line
    first, so they never land in the middle of it.
    """

    def __init__(self, stream: TextIO) -> None:
        self.console = console_for(stream)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def update(self, files_done: int, files_total: int, points: str, seconds: float) -> None:
        global _bar
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        fields: dict[str, Any] = {
            "completed": files_done,
            "total": files_total,
            "points": points,
            "seconds": f"{seconds:.1f} s",
        }
        with signals_deferred():
            if self._progress is None:
                self._progress = Progress(
                    TextColumn("trainsentry: backfill"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("files, {task.fields[points]} points, {task.fields[seconds]}"),
                    console=self.console,
                    auto_refresh=False,
                    transient=True,
                    redirect_stdout=False,  # stdout is the alerts' and points'; leave it be
                    redirect_stderr=False,
                )
                self._task = self._progress.add_task("backfill", **fields)
                self._progress.start()  # draws the first frame
                _bar = self
                atexit.register(self.close)  # a crash mid-backfill must not leave the cursor hidden
            elif self._task is not None:
                self._progress.update(self._task, **fields)
                self._progress.refresh()

    def clear_line(self) -> None:
        """Blank the bar's line (the next update redraws it below what was printed)."""
        if self._progress is not None:
            self.console.file.write("\r\x1b[2K")
            self.console.file.flush()

    def close(self) -> None:
        """Take the bar off the screen (transient) and give the cursor back."""
        global _bar
        with signals_deferred():
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
                atexit.unregister(self.close)
            _bar = None

    def finish(self, line: str, style: str = "green") -> None:
        from rich.text import Text

        self.close()
        with signals_deferred():
            self.console.print(Text(line, style=style))


_bar: BackfillBar | None = None  # the bar on screen now, which alert writes step around
