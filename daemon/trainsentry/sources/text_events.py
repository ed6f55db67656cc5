"""Lines of a job's text log grouped into events: a traceback is one, not twenty.

What a crashed job says is several lines that mean one thing: Python's
traceback from `Traceback (most recent call last):` to its exception line,
chained exceptions (`During handling of the above exception, another
exception occurred:`, `The above exception was the direct cause of the
following exception:`) included; the C++ report PyTorch's c10d watchdog
writes (`[E ProcessGroupNCCL.cpp:...] ... Watchdog caught collective
operation timeout`, `terminate called after throwing an instance of ...`,
`what():`, `Exception raised from ...`, `frame #0: ...`). A rule matches an
event and an alert quotes it whole, so the exception line and the frames
above it travel together. Every other line is an event of its own.

Where an event ends is only known when the next line comes: an exception
line may be followed by a chained one, in the same read or the next. So an
event is held across reads until a line comes that cannot continue it, and
a job that crashed writes nothing more: the reader lets a held event go
(`Grouper.flush`, through the decoder's `let_go`) once its log has been
quiet a moment (runtime/loop.py, HOLD_SECONDS), or at the end of a finished
file (`replay`). A held event is bounded by MAX_EVENT_LINES.

torchrun prefixes each line of a rank's output with `[rank0]:` (or
`[default0]:`); grouping looks past that prefix and the event keeps the
lines as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainsentry.jobs.identity import RANK_PREFIX

MAX_EVENT_LINES = 400  # a longer traceback (deep recursion) is cut into events this long
MAX_LINE_CHARS = 2000  # a longer line is cut: alerts quote lines, they do not archive them

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TRACEBACK = "Traceback (most recent call last):"
CHAINS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# lines that go on an exception's own message or the C++ stack under it
_CONTINUES_EXCEPTION = re.compile(
    r"^(?:\s|frame #\d+|Exception raised from |CUDA kernel errors might|For debugging consider"
    r"|Compile with `TORCH_USE_CUDA_DSA`|Device-side assertions? )"
)
# glog's prefix, as c10d writes it: `[E ProcessGroupNCCL.cpp:475]` (older) or
# `[E1202 13:00:00.123456 1234 ProcessGroupNCCL.cpp:1234]` (newer)
_GLOG = r"\[[EF][\d\s:.]*\s+\S+\.(?:cpp|cc|h):\d+\]"
# the first line of a C++ / c10d report, and the lines that continue one
REPORT_START = rf"^(?:{_GLOG}|terminate called after throwing|Fatal Python error:)"
_REPORT_START = re.compile(REPORT_START)
_REPORT_FIRST = frozenset("[tF")  # what a report's first line can start with, tested first
_CONTINUES_REPORT = re.compile(
    rf"^(?:\s|{_GLOG}|frame #\d+|Exception raised from |what\(\):|Thread 0x|Current thread 0x"
    r"|Stack \(most recent call first\)|Extension modules:|Fatal Python error:|\S+, line \d+ in "
    r"|terminate called after throwing)"
)
LEVEL_WORDS = "CRITICAL|FATAL|ERROR|WARNING|WARN"  # what `level_of` looks for
_LEVEL = re.compile(rf"\b({LEVEL_WORDS})\b")

IDLE, FRAMES, EXCEPTION, REPORT = "idle", "frames", "exception", "report"


def clean(raw: str) -> tuple[str, str]:
    """A line as a person reads it: colours gone, a progress bar's last frame (after its
    carriage returns), cut at MAX_LINE_CHARS; and the character that followed the cut
    ("" for a line not cut), which the pattern rules take as context so that the cut
    never makes a match the whole line does not have (rules/pattern_set.py)."""
    if "\r" in raw:
        parts = [p for p in raw.split("\r") if p.strip()]
        raw = parts[-1] if parts else ""
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    if len(raw) <= MAX_LINE_CHARS:
        return raw, ""
    return raw[:MAX_LINE_CHARS], raw[MAX_LINE_CHARS]


def level_of(line: str) -> str:
    """The logging level a plain line names near its start ("error", "warning"), else ""."""
    head = line[:80]
    # substring tests first: most lines name no level, and four are cheaper than a search
    if not ("ERR" in head or "WARN" in head or "CRIT" in head or "FATAL" in head):
        return ""
    found = _LEVEL.search(head)
    if found is None:
        return ""
    word = found.group(1).lower()
    return {"fatal": "critical", "warn": "warning"}.get(word, word)


@dataclass(slots=True)
class Grouped:
    """An event found: the number of its first line, its lines, its kind."""

    line: int
    lines: list[str]
    kind: str
    cuts: tuple[tuple[int, str], ...] = ()  # TextEvent.cuts


@dataclass(slots=True)
class Grouper:
    """Feeds on numbered lines one by one; hands back the events they complete."""

    state: str = IDLE
    start: int = 0
    held: list[str] = field(default_factory=list)
    blanks: int = 0  # blank lines after an exception line: kept only if a chain follows
    cuts: list[tuple[int, str]] = field(default_factory=list)  # of the held lines

    def push(self, number: int, line: str, out: list[Grouped], after: str = "") -> None:
        """The next line; `after`: the character that followed its cut (`clean`)."""
        bare = RANK_PREFIX.sub("", line, count=1) if line.startswith("[") else line
        state = self.state
        if state == IDLE:
            self._idle(number, line, bare, out, after)
            return
        if len(self.held) >= MAX_EVENT_LINES:
            self.flush(out)
            self._idle(number, line, bare, out, after)
            return
        if state == FRAMES:
            if bare.strip() and not bare[0].isspace() and bare != TRACEBACK and bare not in CHAINS:
                self.state = EXCEPTION  # the exception line
            self._hold(line, after)
        elif state == EXCEPTION:
            if not bare.strip():
                self.blanks += 1
            elif bare in CHAINS or bare == TRACEBACK:
                self.held.extend([""] * self.blanks)
                self._hold(line, after)
                self.blanks, self.state = 0, FRAMES
            elif not self.blanks and _CONTINUES_EXCEPTION.match(bare):
                self._hold(line, after)
            else:
                self.flush(out)
                self._idle(number, line, bare, out, after)
        elif not bare.strip():
            self.blanks += 1
        elif _CONTINUES_REPORT.match(bare):
            self.held.extend([""] * self.blanks)
            self._hold(line, after)
            self.blanks = 0
        else:
            self.flush(out)
            self._idle(number, line, bare, out, after)

    def _hold(self, line: str, after: str) -> None:
        self.held.append(line)
        if after:
            self.cuts.append((len(self.held) - 1, after))

    def _idle(self, number: int, line: str, bare: str, out: list[Grouped], after: str) -> None:
        if bare == TRACEBACK or bare in CHAINS:
            self.state, self.start, self.held = FRAMES, number, []
            self._hold(line, after)
        elif bare[:1] in _REPORT_FIRST and _REPORT_START.match(bare):
            self.state, self.start, self.held = REPORT, number, []
            self._hold(line, after)
        elif line.strip():
            out.append(Grouped(number, [line], "line", ((0, after),) if after else ()))

    @property
    def holding(self) -> bool:
        """Lines held for an event that the next line may still continue."""
        return self.state != IDLE

    def flush(self, out: list[Grouped]) -> None:
        if self.held:
            kind = "report" if self.state == REPORT else "traceback"
            out.append(Grouped(self.start, self.held, kind, tuple(self.cuts)))
        self.state, self.held, self.blanks, self.cuts = IDLE, [], 0, []

    def snapshot(self) -> dict[str, Any]:
        if self.state == IDLE:
            return {}
        state: dict[str, Any] = {"state": self.state, "start": self.start, "held": list(self.held)}
        if self.cuts:
            state["cuts"] = [list(c) for c in self.cuts]
        return state

    def restore(self, state: dict[str, Any]) -> None:
        held = state.get("held")
        if state.get("state") in (FRAMES, EXCEPTION, REPORT) and isinstance(held, list):
            self.state, self.held = state["state"], [str(x) for x in held][:MAX_EVENT_LINES]
            start = state.get("start")
            self.start = start if isinstance(start, int) else 0
            cuts = state.get("cuts")
            self.cuts = [
                (c[0], c[1])
                for c in (cuts if isinstance(cuts, list) else [])
                if isinstance(c, list)
                and len(c) == 2
                and type(c[0]) is int
                and 0 <= c[0] < len(self.held)
                and isinstance(c[1], str)
                and len(c[1]) == 1
            ]
