"""The report as one self-contained HTML page.

Self-contained because a backtest report gets attached to a pull request,
mailed, or opened on an air-gapped cluster: the CSS is inline, the plots are
base64 PNGs, there is no script and no reference to anything on a network.
Every string that came from the logs or the rules (run ids are directory
names, messages quote them) goes through `html.escape` — a run directory may
be called anything.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from trainsentry.alerts.notifier import threshold_of
from trainsentry.backtest.data import (
    RunData,
    aliases_for,
    downsample,
    firing_spans,
    plotted_tags,
    summarize,
)
from trainsentry.backtest.plots import render_series
from trainsentry.jobs import Member, member_of
from trainsentry.rules import model as m
from trainsentry.rules.aliases import Aliases

FEW_RUNS = 3  # up to this many runs, quiet runs get plots too (for context)
MAX_PLOTTED_RUNS = 40  # beyond this, runs with alerts get their table but no plots
MAX_ROWS = 200  # transitions shown per run
MAX_FIRST_STEPS = 12  # runs listed per rule in the summary

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;
max-width:1320px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;
border-bottom:1px solid #ddd;padding-bottom:3px}h3{font-size:15px;margin:18px 0 6px}
.muted{color:#666}table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.critical{color:#b00000;font-weight:600}.warning{color:#a66300;font-weight:600}
.resolved{color:#2a7a2a}.plots{display:flex;flex-wrap:wrap;gap:8px}
.plots img{width:640px;max-width:100%;border:1px solid #eee}
.only{background:#fff4d6}code{font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def sev(severity: str) -> str:
    return f'<span class="{esc(severity)}">{esc(severity)}</span>'


def page(title: str, body: Sequence[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def header(title: str, runs: Sequence[RunData], rules: m.RuleSet, label: str) -> str:
    points = sum(len(s) for r in runs for s in r.series.values())
    alerted = sum(1 for r in runs if r.firings)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f'<h1>{esc(title)}</h1><p class="muted">{len(runs)} run(s), {points:,} points; '
        f"{alerted} run(s) with alerts; rules: {esc(label)} ({len(rules)} rules); {when}</p>"
    )


def summary_section(runs: Sequence[RunData]) -> str:
    rows = summarize(runs)
    if not rows:
        return "<h2>Summary</h2><p>No rule fired in any run.</p>"
    out = [
        "<h2>Summary</h2><table><tr><th>rule</th><th>worst severity</th><th>runs</th>"
        "<th>firings</th><th>first firing step per run</th></tr>"
    ]
    for r in rows:
        firsts = ", ".join(
            f"{esc(run)}: <b>{step}</b>" for run, step in r.first_steps[:MAX_FIRST_STEPS]
        )
        if len(r.first_steps) > MAX_FIRST_STEPS:
            firsts += f", … and {len(r.first_steps) - MAX_FIRST_STEPS} more"
        out.append(
            f"<tr><td>{esc(r.rule)}</td><td>{sev(r.severity)}</td>"
            f'<td class="num">{r.runs}/{len(runs)}</td><td class="num">{r.firings}</td>'
            f"<td>{firsts}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _thresholds(rules: dict[str, m.Rule], names: Sequence[str]) -> list[tuple[float, str]]:
    lines: dict[float, str] = {}
    for name in names:
        for severity in ("warning", "critical"):
            value = threshold_of(rules.get(name), severity)
            if value is not None:
                lines.setdefault(value, f"{name} {value:g}")
    return list(lines.items())


def run_plots(run: RunData, rules: dict[str, m.Rule], aliases: Aliases, context: bool) -> str:
    spans = firing_spans(run.transitions)
    imgs = []
    for tag in plotted_tags(run, aliases, context=context):
        on_tag = [t for t in run.firings if t.metric == tag]
        names = list(dict.fromkeys(t.rule for t in on_tag))
        growth = [
            t for t in on_tag if isinstance(getattr(rules.get(t.rule), "condition", None), m.Growth)
        ]
        canonical = aliases.resolve(tag)
        title = tag if canonical == tag else f"{tag}  ({canonical})"
        uri = render_series(
            title,
            downsample(run.series[tag]),
            spans.get(tag, []),
            on_tag[0] if on_tag else None,
            _thresholds(rules, names),
            growth,
        )
        imgs.append(f'<img alt="{esc(tag)}" src="{uri}">')
    return f'<div class="plots">{"".join(imgs)}</div>' if imgs else ""


def transitions_table(run: RunData) -> str:
    out = [
        "<table><tr><th>step</th><th>state</th><th>severity</th><th>rule</th>"
        "<th>metric</th><th>message</th></tr>"
    ]
    for t in run.transitions[:MAX_ROWS]:
        state: str = "escalated" if t.escalated_from else t.state
        if t.state == "resolved" and t.reason:
            state += f" ({t.reason})"
        css = "resolved" if t.state == "resolved" else ""
        out.append(
            f'<tr><td class="num">{t.step}</td><td class="{css}">{esc(state)}</td>'
            f"<td>{sev(t.severity)}</td><td>{esc(t.rule)}</td><td><code>{esc(t.metric)}</code>"
            f"</td><td>{esc(t.message)}</td></tr>"
        )
    out.append("</table>")
    if len(run.transitions) > MAX_ROWS:
        out.append(f'<p class="muted">… {len(run.transitions) - MAX_ROWS} more transitions</p>')
    return "".join(out)


def describe(run: RunData) -> str:
    steps = [s for pts in run.series.values() for s, _ in pts]
    span = f"steps {min(steps)}–{max(steps)}" if steps else "no points"
    points = sum(len(p) for p in run.series.values())
    text = f"{points:,} points in {len(run.series)} series, {span}"
    nan = run.first_non_finite()
    if nan is not None:
        text += f"; first non-finite value at step {nan}"
    if run.life:
        text += f"; {run.life}"
    return text


def jobs_section(runs: Sequence[RunData]) -> str:
    """The jobs of ranks or attempts (jobs/identity.py): each a table of its ranks, so a
    straggler or a crash loop reads as one job's, not as runs that happen to be near."""
    jobs: dict[str, list[tuple[Member, RunData]]] = {}
    for run in runs:
        member = member_of(run.run)
        if member.ranked or member.attempt is not None:
            jobs.setdefault(member.job, []).append((member, run))
    out: list[str] = []
    for job, members in sorted(jobs.items()):
        members.sort(key=lambda mr: (mr[0].attempt or 0, mr[0].rank or 0, mr[1].run))
        out.append(
            f"<h2>Job {esc(job)}</h2><table><tr><th>attempt</th><th>rank</th><th>run</th>"
            "<th>steps</th><th>life</th><th>alerts</th></tr>"
        )
        for member, run in members:
            steps = [s for pts in run.series.values() for s, _ in pts]
            span = f"{min(steps)}–{max(steps)}" if steps else "–"
            fired = ", ".join(sorted({t.rule for t in run.firings})) or "none"
            out.append(
                f'<tr><td class="num">{esc(member.attempt if member.attempt is not None else "")}'
                f'</td><td class="num">{esc(member.rank if member.rank is not None else "")}</td>'
                f"<td>{esc(run.run)}</td><td>{esc(span)}</td><td>{esc(run.life or '')}</td>"
                f"<td>{esc(fired)}</td></tr>"
            )
        out.append("</table>")
    return "\n".join(out)


def runs_section(runs: Sequence[RunData], rules: m.RuleSet) -> str:
    by_name = {r.name: r for r in rules.rules}
    aliases = aliases_for(rules)
    few = len(runs) <= FEW_RUNS
    out: list[str] = []
    quiet: list[RunData] = []
    plotted = 0
    for run in runs:
        if not run.firings and not few:
            quiet.append(run)
            continue
        out.append(f'<h2>{esc(run.run)}</h2><p class="muted">{esc(describe(run))}</p>')
        if plotted < MAX_PLOTTED_RUNS:
            out.append(run_plots(run, by_name, aliases, context=few))
            plotted += 1
        out.append(transitions_table(run) if run.firings else "<p>No alerts.</p>")
    if quiet:
        out.append("<h2>Runs without alerts</h2><ul>")
        out.extend(f"<li>{esc(r.run)}: no alerts ({esc(describe(r))})</li>" for r in quiet)
        out.append("</ul>")
    return "\n".join(out)
