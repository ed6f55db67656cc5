"""What a person reads: a title that says severity, run and what happened, and a
markdown body with the evidence.

The body answers the questions asked in the first minute of an incident: how
bad (value, threshold, peak), since when (step, time, firing for how long),
what the rule saw (its message: the window, the fit, the projection), what to
do (the runbook hint, the actions already taken) and where to look (the link
built from `--link-template`). A batch — a run that tripped several rules —
gets one title for the run and one section per alert.

What the job wrote (the run's name, a tag, the rule's message with the log
lines it quotes, a reason, an action's outcome) is kept apart from the
daemon's own markdown (`Marked`), so each sink can make it inert for its
target's markup (sinks/forwarded_text.py); as a str, a title or body is the
exact text.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from trainsentry.alert import Notice, Transition
from trainsentry.sinks.forwarded_text import Forwarded, Marked, join

TITLE_MAX = 160
SEVERITY_ORDER = {"critical": 2, "warning": 1}


def duration(seconds: float) -> str:
    """3h 20m, 12m 5s, 40s: two units are as precise as anyone reads."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    parts = [(s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "m"), (s % 60, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return "time unknown"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: float) -> str:
    return f"{value:.6g}"  # nan, inf as they are: the evidence


def link_for(template: str | None, alert: Transition) -> str | None:
    """`{run}`, `{rule}`, `{metric}`, `{step}` in the template, URL-quoted."""
    if not template:
        return None
    fields = {k: quote(str(getattr(alert, k)), safe="") for k in ("run", "rule", "metric", "step")}
    fields["run_path"] = quote(alert.run, safe="/")
    try:
        return template.format_map(fields)
    except (KeyError, ValueError, IndexError):
        return None


def message_severity(notices: list[Notice]) -> str:
    firing = [n.alert.severity for n in notices if not n.resolved]
    if not firing:
        return "resolved"
    return max(firing, key=lambda s: SEVERITY_ORDER.get(s, 0))


def _headline(n: Notice) -> Marked:
    alert = n.alert
    if alert.resolved:
        reason = n.reason or alert.reason or "recovered"
        return Marked(f"{alert.rule} resolved (", Forwarded(reason), ")")
    if n.kind == "repeat":
        return Marked(f"{alert.rule} still firing: ", Forwarded(alert.message))
    return Marked(f"{alert.rule}: ", Forwarded(alert.message))


def title(notices: list[Notice]) -> Marked:
    severity = message_severity(notices)
    run = notices[0].alert.run
    what: Marked
    if len(notices) == 1:
        what = _headline(notices[0])
    else:
        states = [n.alert.state for n in notices]
        firing, resolved = states.count("firing"), states.count("resolved")
        counts = ", ".join(
            f"{n} {word}" for n, word in ((firing, "firing"), (resolved, "resolved")) if n
        )
        rules = ", ".join(dict.fromkeys(n.alert.rule for n in notices))
        what = Marked(f"{len(notices)} alerts ({counts}): {rules}")
    live = [n for n in notices if not n.resolved]
    if live and all(n.joins for n in live):  # an incident's update, not a new page
        what = Marked(f"update to the incident of {live[0].joins}: ", what)
    return Marked(f"[{severity.upper()}] ", Forwarded(run), ": ", what).cut(TITLE_MAX)


def section(n: Notice, now: float, resolved_later: bool = False) -> Marked:
    alert = n.alert
    metric = Forwarded(alert.metric, code=True)
    facts: list[str | Marked] = [
        Marked("- run ", Forwarded(alert.run, code=True), f", severity {alert.severity}"),
        Marked(
            "- ",
            Forwarded(alert.canonical or alert.metric),
            f" = {number(alert.value)} (",
            metric,
            f") at step {alert.step}, {when(alert.wall_time)}",
        ),
    ]
    if n.threshold is not None:
        facts.append(f"- threshold {number(n.threshold)}")
    if alert.resolved:
        if n.duration is not None:
            facts.append(f"- was firing for {duration(n.duration)}")
        if n.peak is not None:
            facts.append(f"- peak {number(n.peak)} at step {n.peak_step}")
    elif n.since is not None and not resolved_later:
        facts.append(f"- firing for {duration(now - n.since)} (since {when(n.since)})")
    if alert.escalated_from:
        facts.append(f"- escalated from {alert.escalated_from}")
    if n.joins and not alert.resolved:
        facts.append(f"- joins the incident opened by {n.joins}")
    if alert.runbook and not alert.resolved:
        facts.append(f"- runbook: {alert.runbook}")
    facts.extend(Marked("- action: ", Forwarded(a)) for a in n.actions)
    if n.link:
        facts.append(f"- [open the run]({n.link})")
    return join("\n", [Marked("**", _headline(n), "**"), "", *facts])


def body(notices: list[Notice], now: float) -> Marked:
    """One section per alert; a firing resolved later in the same batch says no "firing for"."""
    sections = []
    for i, n in enumerate(notices):
        later = any(q.resolved and q.alert.key == n.alert.key for q in notices[i + 1 :])
        sections.append(section(n, now, later))
    return join("\n\n---\n\n", sections)
