"""The probe's meta and end records read as marks of the run's process (probe/FORMAT.md).

They carry no metric, so the JSONL decoder would drop them; the run's life
needs them: the meta record says which process on which host writes the
run (the daemon on that host can then see it die), the end record that it
closed, cleanly or on an exception (a run that ended, not one that went
quiet). Only records the probe marks as its own (`format`) count: another
writer's `{"kind": "end"}` is its business.
"""

from __future__ import annotations

from typing import Any

from trainsentry.point import ProbeMark

PROBE_FORMAT = "trainsentry-probe"
_KINDS = ("meta", "end")
_MAX_TEXT = 500  # an exception's message is quoted, not archived


def is_mark(record: dict[str, Any]) -> bool:
    return record.get("format") == PROBE_FORMAT and record.get("kind") in _KINDS


def mark_of(record: dict[str, Any], line: int, file_time: float) -> ProbeMark:
    """The mark a probe record `is_mark` makes; fields the probe did not give are blank."""

    def text(key: str) -> str:
        value = record.get(key)
        return value[:_MAX_TEXT] if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = record.get(key)
        return value if type(value) is int else None

    wall = record.get("time")
    return ProbeMark(
        kind=str(record["kind"]),
        path="",
        line=line,
        wall_time=float(wall) if isinstance(wall, (int, float)) else file_time,
        step=number("step") or 0,
        host=text("host"),
        pid=number("pid") or 0,
        pid_start=number("pid_start"),
        pid_ns=text("pid_ns"),
        exit=text("exit"),
        error=text("error"),
    )
