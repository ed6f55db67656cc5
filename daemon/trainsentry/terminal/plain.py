"""The plain lines: what journald, files, CI logs, grep and users' scripts read.

Off a terminal (or with `--color never`) every command prints these; they are a
contract, so they change only on purpose. On a terminal render.py draws the
same facts with rich. Pure functions of a transition or of the HTTP API's JSON
documents, so they are tested without a daemon.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from trainsentry.alert import Transition


def format_text(t: Transition, note: str = "") -> str:
    """One timeline line: when, where, what, and why (and `note`, in brackets after it)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t.wall_time)) if t.wall_time > 0 else "-"
    state = t.state.upper() if t.state != "firing" or not t.escalated_from else "ESCALATED"
    line = (
        f"{when}  {t.run}  step {t.step:>8}  {state:<9} {t.severity:<8} {t.rule}  "
        f"[{t.metric}]  {t.message}"
    )
    if note:
        line += f"  ({note})"
    if t.state == "firing" and t.runbook:
        line += f"\n{'':>20}runbook: {t.runbook}"
    return line


def format_age(seconds: float | None) -> str:
    """42s, 12m, 3h05m, 2d04h: precise when fresh, coarse when old."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def loaded(
    api_runs_json: Any, api_alerts_json: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs (sorted by name) and alerts of the documents as served, as text or parsed."""

    def items(doc: Any, key: str) -> list[dict[str, Any]]:
        if isinstance(doc, (str, bytes)):
            doc = json.loads(doc)
        found = doc.get(key, []) if isinstance(doc, dict) else doc
        return [x for x in found or [] if isinstance(x, dict)]

    runs = sorted(items(api_runs_json, "runs"), key=lambda r: str(r.get("run")))
    return runs, items(api_alerts_json, "alerts")


def nothing_readable(api_runs_json: Any) -> list[str]:
    """The watched paths that hold no log the daemon reads, as /api/runs says them."""
    doc = json.loads(api_runs_json) if isinstance(api_runs_json, (str, bytes)) else api_runs_json
    lines = doc.get("nothing_readable") if isinstance(doc, dict) else None
    return [str(x) for x in lines] if isinstance(lines, list) else []


def unreadable(api_runs_json: Any) -> list[str]:
    """The paths the daemon cannot read now, with why, as /api/runs says them."""
    doc = json.loads(api_runs_json) if isinstance(api_runs_json, (str, bytes)) else api_runs_json
    found = doc.get("unreadable") if isinstance(doc, dict) else None
    if not isinstance(found, list):
        return []
    return [f"cannot read {x.get('path')}: {x.get('reason')}" for x in found if isinstance(x, dict)]


def given_up(api_alerts_json: Any) -> int:
    """Notifications the daemon gave up (kept a week in its outbox), from /api/alerts."""
    doc = (
        json.loads(api_alerts_json)
        if isinstance(api_alerts_json, (str, bytes))
        else api_alerts_json
    )
    counts = doc.get("notifications") if isinstance(doc, dict) else None
    failed = counts.get("failed", 0) if isinstance(counts, dict) else 0
    return failed if isinstance(failed, int) else 0


def summary_line(
    runs: Sequence[dict[str, Any]], alerts: Sequence[dict[str, Any]], dropped: int = 0
) -> str:
    critical = sum(1 for a in alerts if a.get("severity") == "critical")
    summary = f"{len(runs)} run{'s' * (len(runs) != 1)}, {len(alerts)} firing"
    if alerts:
        summary += f" ({critical} critical, {len(alerts) - critical} warning)"
    if dropped:  # a receiver refused them for good: someone was not told
        summary += (
            f"; {dropped} notification(s) given up in the last week (the daemon's log says why)"
        )
    return summary


def run_label(r: dict[str, Any]) -> str:
    """A run's name, with how it ended when it is no longer running (`exp1 (crashed: ...)`),
    a rank's place in its job (`  exp/rank3 (rank 3, node-a)`), and the process watched
    for it on the daemon's host (`exp1 [process 1234: python train.py]`, `[probe: process
    1234]`)."""
    state = r.get("state") or "running"
    name = str(r.get("run"))
    if r.get("rank") is not None:
        where = [f"rank {r['rank']}"]
        if r.get("attempt"):
            where.append(f"attempt {r['attempt']}")
        if r.get("node"):
            where.append(str(r["node"]))
        name = f"  {name} ({', '.join(where)})"
    attempts = r.get("attempts")
    if isinstance(attempts, dict) and (attempts.get("count") or 0) > 1:
        name += f" [attempt {attempts.get('current')} of {attempts['count']}]"
    watched = r.get("watched")
    if isinstance(watched, dict) and watched.get("pid") is not None:
        if watched.get("by") == "probe":
            name += f" [probe: process {watched['pid']}]"
        else:
            name += f" [process {watched['pid']}: {watched.get('command') or '?'}]"
    if state == "running":
        return name
    cause = r.get("cause")
    return f"{name} ({state}: {cause})" if cause else f"{name} ({state})"


def by_job(runs: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any] | None]]:
    """The runs in status order: a job of ranks under a line of its own (None: that line),
    its own runs first, then its ranks by attempt and rank; other runs by name."""

    def order(r: dict[str, Any]) -> tuple[bool, int, int, str]:
        ranked = r.get("rank") is not None
        return (ranked, r.get("attempt") or 0, r.get("rank") or 0, str(r.get("run")))

    jobs: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        jobs.setdefault(str(r.get("job") or r.get("run")), []).append(r)
    out: list[tuple[str, dict[str, Any] | None]] = []
    for job, members in sorted(jobs.items()):
        ranks = [r for r in members if r.get("rank") is not None]
        if ranks:
            attempts = {r.get("attempt") or 0 for r in ranks}
            more = f", {len(attempts)} attempts" if len(attempts) > 1 else ""
            out.append((f"{job}: job of {len(ranks)} rank(s){more}", None))
        out.extend((run_label(r), r) for r in sorted(members, key=order))
    return out


def checkpoint_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Each job's last good checkpoint, once per job however many of its runs share it:
    `exp1: last good checkpoint step 500, 12m ago: /ckpt/checkpoint-500`."""
    newest: dict[str, dict[str, Any]] = {}
    for r in runs:
        saved = r.get("checkpoint")
        if not isinstance(saved, dict):
            continue
        job = str(r.get("job") or r.get("run"))
        known = newest.get(job)
        if known is None or (saved.get("step") or 0) > (known.get("step") or 0):
            newest[job] = saved
    return [
        f"{job}: last good checkpoint step {saved.get('step')},"
        f" {format_age(saved.get('age_seconds'))} ago: {saved.get('path')}"
        for job, saved in sorted(newest.items())
    ]


def render_status(api_runs_json: Any, api_alerts_json: Any) -> str:
    """The runs table and the firing alerts' messages, as plain lines for pipes and scripts.

    One row per run, sorted by name, the ranks of a job under its name; a run with
    several firing alerts gets one extra line per alert. (On a terminal, render.py
    draws the same.)
    """
    runs, alerts = loaded(api_runs_json, api_alerts_json)
    rows: list[tuple[str, str, str, str, str]] = []  # run, step, age, severity, what
    for label, r in by_job(runs):
        if r is None:
            rows.append((label, "", "", "", ""))
            continue
        step = "-" if r.get("last_step") is None else str(r["last_step"])
        age = format_age(r.get("age_seconds"))
        firing = r.get("firing") or []
        if not firing:
            rows.append((label, step, age, "", "-"))
        for i, a in enumerate(firing):
            what = f"{a.get('rule')} ({a.get('metric')})"
            cells = (label, step, age) if i == 0 else ("", "", "")
            rows.append((*cells, str(a.get("severity", "")), what))
    header = ("RUN", "STEP", "AGE", "FIRING")
    w_run = max([len(header[0])] + [len(row[0]) for row in rows])
    w_step = max([len(header[1])] + [len(row[1]) for row in rows])
    w_age = max([len(header[2])] + [len(row[2]) for row in rows])
    lines = [f"{header[0]:<{w_run}}  {header[1]:>{w_step}}  {header[2]:>{w_age}}  {header[3]}"]
    for run, step, age, severity, what in rows:
        rest = f"{severity} {what}" if severity else what
        lines.append(f"{run:<{w_run}}  {step:>{w_step}}  {age:>{w_age}}  {rest}")
    lines.append(summary_line(runs, alerts, given_up(api_alerts_json)))
    lines.extend(checkpoint_lines(runs))
    lines.extend(nothing_readable(api_runs_json))
    lines.extend(unreadable(api_runs_json))
    if alerts:
        lines.append("")
        for a in alerts:
            severity = str(a.get("severity", ""))
            message = " ".join(str(a.get("message", "")).split())
            lines.append(f"{severity:<8}  {a.get('run')}  {a.get('rule')}: {message}")
    return "\n".join(lines) + "\n"
