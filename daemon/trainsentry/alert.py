"""An alert transition: the contract between the rules and everything that tells people.

The engine emits one when an alert fires, escalates or resolves; the terminal,
`--alerts-jsonl`, `replay --format jsonl`, the outbox, Alertmanager and the
stop file all carry it. Its JSON form (`as_dict`) is the alert line of
DESIGN.md that other tools parse, so its keys only grow, and `from_dict`
reads back what `as_dict` wrote (the outbox stores alerts as those lines).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

Severity = Literal["warning", "critical"]
State = Literal["firing", "resolved"]
AlertKey = tuple[str, str, str]  # (run, rule, metric): one alert across escalation and resolve
SEVERITIES: tuple[Severity, ...] = ("warning", "critical")


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
        for key in ("reason", "escalated_from", "runbook"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
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
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an alert line: {exc!r}") from None
