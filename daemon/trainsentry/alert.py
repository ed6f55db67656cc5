"""An alert transition, and the notice that tells it: the contract from the rules onward.

The engine emits one when an alert fires, escalates or resolves; the terminal,
`--alerts-jsonl`, `replay --format jsonl`, the outbox, Alertmanager and the
stop file all carry it. Its JSON form (`as_dict`) is the alert line of
DESIGN.md that other tools parse, so its keys only grow, and `from_dict`
reads back what `as_dict` wrote. A `Notice` is a transition on its way to a
receiver, with what the notifier knew then (since when, the threshold, the
peak, the incident bundle); the outbox keeps notices as JSON until they are
confirmed, and every sink renders from one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from trainsentry.jobs import member_of

Severity = Literal["warning", "critical"]
State = Literal["firing", "resolved"]
AlertKey = tuple[str, str, str]  # (run, rule, metric): one alert across escalation and resolve


SEVERITIES: tuple[Severity, ...] = ("warning", "critical")

# The reasons of a resolve the data made: the series back in the band it left, or a
# change that persists told as such ("settled at a new level, ×5.4 the old (0.13 → 0.71)").
RECOVERED = "recovered"
SETTLED = "settled at a new level"


def went_quiet(reason: str | None) -> bool:
    """A resolve the condition's own data made, not one from outside (run finished, data
    stopped, inhibited): the next point may fire it again, so receivers hold it a while."""
    return reason == RECOVERED or (reason is not None and reason.startswith(SETTLED))


def json_number(value: float) -> float | str:
    """JSON has no NaN or infinity; a non-finite value is itself the evidence, so it is text."""
    return value if math.isfinite(value) else str(value)


def from_json_number(value: Any) -> float:
    """A number as json_number wrote it ("nan", "inf", "-inf" included); NaN if absent."""
    if value is None:
        return math.nan
    return float(value)


@dataclass(frozen=True, slots=True)
class Transition:
    """One change an alert went through, as the outbox and `replay` see it."""

    run: str
    rule: str
    severity: Severity
    state: State
    step: int
    wall_time: float
    metric: str  # the raw tag, as the writer named it
    value: float
    message: str
    canonical: str = ""
    family: str = ""
    reason: str | None = None  # for resolved: recovered, run finished, data stopped, ...
    escalated_from: Severity | None = None
    runbook: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # a pattern alert's event: {"path", "line", "lines"} (its telling lines, masked)
    log: dict[str, Any] | None = None

    @property
    def key(self) -> AlertKey:
        """Alert identity: the same across an escalation and its resolve."""
        return (self.run, self.rule, self.metric)

    @property
    def resolved(self) -> bool:
        return self.state == "resolved"

    def as_dict(self) -> dict[str, object]:
        """The alert line of DESIGN.md, plus optional keys where they say something."""
        out: dict[str, object] = {
            "run": self.run,
            "rule": self.rule,
            "severity": self.severity,
            "state": self.state,
            "step": self.step,
            "wall_time": self.wall_time if math.isfinite(self.wall_time) else None,
            "metric": self.metric,
            "value": json_number(self.value),
            "message": self.message,
            "canonical": self.canonical,
            "family": self.family,
            "labels": dict(self.labels),
        }
        out.update(member_of(self.run).keys())  # job, and rank and attempt where known
        for key in ("reason", "escalated_from", "runbook"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.log is not None:
            out["log"] = dict(self.log)
        return out

    @classmethod
    def from_dict(cls, line: Mapping[str, Any]) -> Transition:
        """The transition an alert line describes (ValueError if it is not one)."""
        try:
            severity, state = line["severity"], line["state"]
            if severity not in SEVERITIES or state not in ("firing", "resolved"):
                raise ValueError(f"not an alert: severity {severity!r}, state {state!r}")
            escalated = line.get("escalated_from")
            if escalated is not None and escalated not in SEVERITIES:
                raise ValueError(f"not a severity: {escalated!r}")
            return cls(
                run=str(line["run"]),
                rule=str(line["rule"]),
                severity=cast(Severity, severity),
                state=cast(State, state),
                step=int(line["step"]),
                wall_time=from_json_number(line.get("wall_time")),
                metric=str(line["metric"]),
                value=from_json_number(line.get("value")),
                message=str(line.get("message", "")),
                canonical=str(line.get("canonical", "")),
                family=str(line.get("family", "")),
                reason=line.get("reason"),
                escalated_from=cast("Severity | None", escalated),
                runbook=line.get("runbook"),
                labels={str(k): str(v) for k, v in (line.get("labels") or {}).items()},
                log=_log_of(line.get("log")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an alert line: {exc!r}") from None


def _log_of(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    lines = value.get("lines")
    return {
        "path": str(value.get("path", "")),
        "line": int(value.get("line", 0)),
        "lines": [str(x) for x in lines] if isinstance(lines, list) else [],
    }


NoticeKind = Literal["firing", "repeat", "resolved", "action"]


@dataclass(frozen=True, slots=True)
class Command:
    """A rule's command action, carried by the notice that runs it."""

    argv: tuple[str, ...]
    timeout: float


@dataclass(frozen=True, slots=True)
class Notice:
    """One notification's content: a transition and what the notifier knew when it wrote it.

    The outbox keeps it as JSON (`to_json`) until a receiver took it, so it must
    read back whole after a restart (`from_json`); every sink renders from it.
    Optional facts are None where they do not apply or were not known.
    """

    alert: Transition
    kind: NoticeKind
    at: float  # when the notifier wrote it (daemon clock)
    since: float | None = None  # when the alert first fired (daemon clock)
    threshold: float | None = None  # the rule's line, where it has one
    link: str | None = None  # from --link-template
    incident: str | None = None  # the incident bundle's path
    first_step: int | None = None  # where the firing began
    first_wall: float | None = None
    actions: tuple[str, ...] = ()  # what the rule's actions did, in words
    reason: str | None = None  # a resolve's
    duration: float | None = None  # how long it fired, for a resolve
    peak: float | None = None  # the worst value while it fired, for a resolve
    peak_step: int | None = None
    run_dir: str | None = None  # for an action
    command: Command | None = None  # for an action
    # the incident this firing joins, for a receiver already paged for it:
    # "loss_non_finite at step 5 of exp" (its update, not a page of its own)
    joins: str | None = None

    @property
    def resolved(self) -> bool:
        return self.alert.state == "resolved"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.alert.as_dict(), "kind": self.kind, "at": self.at}
        for key in _OPTIONAL:
            value = getattr(self, key)
            if value is not None:
                out[key] = json_number(value) if key == "peak" else value
        if self.actions:
            out["actions"] = list(self.actions)
        if self.command is not None:
            out["command"] = {"argv": list(self.command.argv), "timeout": self.command.timeout}
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Notice:
        """The notice `as_dict` wrote (ValueError if it is not one)."""
        try:
            kind = data["kind"]
            if kind not in ("firing", "repeat", "resolved", "action"):
                raise ValueError(f"not a notice kind: {kind!r}")
            command = data.get("command")
            optional = {k: data.get(k) for k in _OPTIONAL}
            if optional["peak"] is not None:
                optional["peak"] = from_json_number(optional["peak"])
            return cls(
                alert=Transition.from_dict(data["alert"]),
                kind=kind,
                at=float(data["at"]),
                actions=tuple(str(a) for a in data.get("actions") or ()),
                command=None
                if command is None
                else Command(tuple(map(str, command["argv"])), float(command["timeout"])),
                **optional,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a notice: {exc!r}") from None

    @classmethod
    def from_json(cls, text: str) -> Notice:
        return cls.from_dict(json.loads(text))


_OPTIONAL = (
    "since", "threshold", "link", "incident", "first_step", "first_wall", "reason",
    "duration", "peak", "peak_step", "run_dir", "joins",
)  # fmt: skip
