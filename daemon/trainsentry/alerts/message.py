"""What a person reads: a title that says severity, run and what happened, and a
markdown body with the evidence.

The body answers the questions asked in the first minute of an incident: how
bad (value, threshold, peak), since when (step, time, firing for how long),
what the rule saw (its message: the window, the fit, the projection), what to
do (the runbook hint, the actions already taken) and where to look (the link
built from `--link-template`). A batch — a run that tripped several rules —
gets one title for the run and one section per alert.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

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


def number(value: Any) -> str:
    if isinstance(value, (int, float)):
        return f"{value:.6g}"
    return str(value)  # "nan", "inf" arrive as text from the JSON payload


def link_for(template: str | None, alert: dict[str, Any]) -> str | None:
    """`{run}`, `{rule}`, `{metric}`, `{step}` in the template, URL-quoted."""
    if not template:
        return None
    fields = {k: quote(str(alert.get(k, "")), safe="") for k in ("run", "rule", "metric", "step")}
    fields["run_path"] = quote(str(alert.get("run", "")), safe="/")
    try:
        return template.format_map(fields)
    except (KeyError, ValueError, IndexError):
        return None


def message_severity(payloads: list[dict[str, Any]]) -> str:
    firing = [p["alert"]["severity"] for p in payloads if p["alert"]["state"] != "resolved"]
    if not firing:
        return "resolved"
    return max(firing, key=lambda s: SEVERITY_ORDER.get(s, 0))


def _headline(p: dict[str, Any]) -> str:
    alert = p["alert"]
    if alert["state"] == "resolved":
        return f"{alert['rule']} resolved ({p.get('reason') or alert.get('reason') or 'recovered'})"
    if p.get("kind") == "repeat":
        return f"{alert['rule']} still firing: {alert['message']}"
    return f"{alert['rule']}: {alert['message']}"


def title(payloads: list[dict[str, Any]]) -> str:
    severity = message_severity(payloads)
    run = payloads[0]["alert"]["run"]
    if len(payloads) == 1:
        what = _headline(payloads[0])
    else:
        states = [p["alert"]["state"] for p in payloads]
        firing, resolved = states.count("firing"), states.count("resolved")
        counts = ", ".join(
            f"{n} {word}" for n, word in ((firing, "firing"), (resolved, "resolved")) if n
        )
        rules = ", ".join(dict.fromkeys(p["alert"]["rule"] for p in payloads))
        what = f"{len(payloads)} alerts ({counts}): {rules}"
    text = f"[{severity.upper()}] {run}: {what}"
    return text if len(text) <= TITLE_MAX else text[: TITLE_MAX - 1] + "…"


def _identity(p: dict[str, Any]) -> tuple[Any, ...]:
    a = p["alert"]
    return (a["run"], a["rule"], a["metric"])


def section(p: dict[str, Any], now: float, resolved_later: bool = False) -> str:
    alert = p["alert"]
    lines = [f"**{_headline(p)}**", ""]
    facts = [
        f"- run `{alert['run']}`, severity {alert['severity']}",
        f"- {alert.get('canonical') or alert['metric']} = {number(alert.get('value'))}"
        f" (`{alert['metric']}`) at step {alert.get('step')}, {when(alert.get('wall_time'))}",
    ]
    if p.get("threshold") is not None:
        facts.append(f"- threshold {number(p['threshold'])}")
    if alert["state"] == "resolved":
        if p.get("duration") is not None:
            facts.append(f"- was firing for {duration(float(p['duration']))}")
        if p.get("peak") is not None:
            facts.append(f"- peak {number(p['peak'])} at step {p.get('peak_step')}")
    elif p.get("since") is not None and not resolved_later:
        facts.append(f"- firing for {duration(now - float(p['since']))} (since {when(p['since'])})")
    if alert.get("escalated_from"):
        facts.append(f"- escalated from {alert['escalated_from']}")
    if alert.get("runbook") and alert["state"] != "resolved":
        facts.append(f"- runbook: {alert['runbook']}")
    facts.extend(f"- action: {a}" for a in p.get("actions", ()))
    if p.get("link"):
        facts.append(f"- [open the run]({p['link']})")
    return "\n".join([*lines, *facts])


def body(payloads: list[dict[str, Any]], now: float) -> str:
    """One section per alert; a firing resolved later in the same batch says no "firing for"."""
    sections = []
    for i, p in enumerate(payloads):
        later = any(
            q["alert"]["state"] == "resolved" and _identity(q) == _identity(p)
            for q in payloads[i + 1 :]
        )
        sections.append(section(p, now, later))
    return "\n\n---\n\n".join(sections)
