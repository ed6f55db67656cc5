"""A text log's plain lines found in one RE2 pass over a read, and passed on together.

A job's stdout is mostly progress lines: no rule matches them, they start no
traceback, name no level or rank and show no secret. Made into an event each
(decoded, cleaned, masked, grouped, a TextEvent, placed on its run, scanned by
the rules) they cost ~7 µs a line, 10 MB/s. So the text decoder (textlog.py)
scans each read's bytes once for every shape a line needs Python for
(`next_worked`): a traceback's or a c10d report's first line, a chained
exception's, a rank's prefix, a level's name, a carriage return or a colour,
a secret's shape (secrets.py). The lines between two such lines are decoded
at once and passed on as one event of kind PLAIN, its text their lines joined
by newlines, numbered from its first line.

Each of those lines is what it would have been alone: a "line" event, level
"", nothing to clean or mask, no rank's run but the file's. The one exception
is a line longer than the line limit, which is cut (and masked once cut, a cut
can make a secret's shape) when its event is made (`plain_events`). So
consumers see exactly the events of old, when they want them: the pattern
rules scan a PLAIN event's text with their RE2 Set in one call and make events
of its lines only where the Set matched (rules/log_rules.py); a run's last
lines for its bundle are the PLAIN event's last (`plain_lines`,
store/log_lines.py).
"""

from __future__ import annotations

import re2

from trainsentry.jobs.identity import RANK_PREFIX
from trainsentry.point import TextEvent
from trainsentry.sources.secrets import SECRET_SHAPES, mask_secrets
from trainsentry.sources.text_events import (
    CHAINS,
    LEVEL_WORDS,
    MAX_LINE_CHARS,
    REPORT_START,
    TRACEBACK,
    clean,
)

PLAIN = "plain"  # TextEvent.kind of plain lines passed on together

# What a line needs Python for, as RE2 reads it over a whole read (`^` at each line).
# Each shape finds at least the lines the Python code acts on (a level's name anywhere
# in the line, where `level_of` looks in its first 80 characters; no `\b` after it, as
# the 80th character can end a word the line goes on with), so it may send a line to
# Python that needs nothing, never the reverse.
_SHAPES = (
    re2.escape(TRACEBACK),
    *(re2.escape(chain) for chain in CHAINS),
    REPORT_START,
    RANK_PREFIX.pattern,
    rf"\b(?:{LEVEL_WORDS})",
    r"[\r\x1b]",  # a progress bar's redraw, a colour: `clean` has work to do
    *SECRET_SHAPES,
)
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.never_capture = True  # where a match starts is all that is asked: 3 µs a search, not 7
_WORK = re2.compile("(?m)" + "|".join(f"(?:{shape})" for shape in _SHAPES), _OPTIONS)


def next_worked(data: bytes, pos: int, end: int) -> int:
    """The offset of the first line of `data[pos:end]` (whole lines, `pos` a line's start)
    that needs Python, or `end`."""
    found = _WORK.search(data, pos, end)
    if found is None:
        return end
    return data.rfind(b"\n", pos, found.start()) + 1 or pos


def plain_event(text: str, line: int, wall: float) -> TextEvent:
    """The lines of `text` (no newline after the last), the first of them line `line`."""
    return TextEvent("", line, wall, (text,), PLAIN)


def plain_events(event: TextEvent) -> list[TextEvent]:
    """A PLAIN event's lines as the "line" events each would have been alone."""
    path, first, wall, run = event.path, event.line, event.wall_time, event.run
    out = []
    for k, line in enumerate(event.lines[0].split("\n")):
        if not line.strip():
            continue  # a blank line is no event
        cuts: tuple[tuple[int, str], ...] = ()
        if len(line) > MAX_LINE_CHARS:
            line, after = clean(line)
            line, cuts = mask_secrets(line, after), ((0, after),)
        out.append(TextEvent(path, first + k, wall, (line,), "line", "", run, cuts))
    return out


def plain_lines(event: TextEvent, last: int) -> list[tuple[int, str]]:
    """(line number, text) of the last `last` lines of a PLAIN event that are events."""
    text = event.lines[0]
    end = event.line + text.count("\n")
    want = last
    while True:
        pieces = text.rsplit("\n", want)
        whole = len(pieces) <= want  # each line of the text is a piece
        lines = pieces if whole else pieces[1:]
        kept = [(end - k, _shown(x)) for k, x in enumerate(reversed(lines)) if x.strip()]
        if whole or len(kept) >= last:
            return kept[:last][::-1]
        want *= 2  # blank lines among the last: look further back


def _shown(line: str) -> str:
    """A plain line as its event holds it: cut and masked if longer than the limit."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    return mask_secrets(*clean(line))
