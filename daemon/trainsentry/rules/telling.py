"""The lines of a text event a person paged needs, out of the many it has.

A traceback is dozens of lines; the page needs its last exception line, the
frame that raised it, and what it was raised while handling. A c10d report
or a plain line is quoted as the line the rule matched. torchrun's
`[rank0]:` prefix is looked past, as grouping does (sources/text_events.py).
"""

from __future__ import annotations

import re

from trainsentry.jobs.identity import RANK_PREFIX
from trainsentry.point import TextEvent

TELLING_LINES = 5
# lines under an exception line that continue it (CUDA's hints, c10's C++ stack)
_CONTINUATION = re.compile(
    r"^(?:frame #\d+|Exception raised from |CUDA kernel errors might"
    r"|For debugging consider|Compile with `TORCH_USE_CUDA_DSA`)"
)
_NOT_EXCEPTION = ("Traceback (most recent call last):", "During handling of", "The above exception")


def telling(event: TextEvent, matched: int) -> tuple[str, ...]:
    """The lines a person needs from the event: the matched one (`matched`, its index
    among the event's lines); for a traceback its last exception line first, the frame
    that raised it, and what it was raised during."""
    lines = event.lines
    hit = lines[matched].strip()
    if event.kind != "traceback":
        return (hit,)
    exceptions = [
        i
        for i, line in enumerate(lines)
        if line.strip()
        and not _indented(line)
        and not _bare(line).startswith(_NOT_EXCEPTION)
        and not _CONTINUATION.match(_bare(line))
    ]
    if not exceptions:
        return (hit,)
    last = exceptions[-1]
    frames = [x.strip() for x in lines[:last] if _indented(x) and x.strip()]
    frames = [f for f in frames if set(f) - set("^~ ")][-2:]  # no caret markers
    out = [lines[last].strip(), *frames]
    if hit not in out and not _bare(hit).startswith(_NOT_EXCEPTION):
        out.insert(0, hit)  # the rule matched an earlier line: the reason it fired
    earlier = [lines[i].strip() for i in exceptions[:-1] if lines[i].strip() not in out]
    if earlier:
        out.append(f"while handling: {earlier[-1]}")
    return tuple(out[:TELLING_LINES])


def _bare(line: str) -> str:
    return RANK_PREFIX.sub("", line.strip(), count=1)


def _indented(line: str) -> bool:
    """A frame or a continuation: indented once the rank prefix is off (torch's excepthook
    writes `[rank2]: ` before every line, so an exception line has that one space)."""
    found = RANK_PREFIX.match(line)
    rest = line[found.end() :] if found is not None else line
    return rest[:1].isspace()
