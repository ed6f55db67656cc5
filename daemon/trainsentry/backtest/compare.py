"""Two rule packs on the same runs: what each catches that the other misses.

A rule change is judged on history: does the new pack still catch the
divergences the old one did, does it page earlier, and what did it stop
(or start) firing on. Both packs are replayed over the same points in the
same order, so every difference in the tables is a difference of the rules.
Lead time is counted in steps: to the first non-finite value of the run
where there is one, and between the two packs' first critical alerts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainsentry.backtest.data import RunData
from trainsentry.backtest.page import esc, sev


@dataclass(frozen=True, slots=True)
class RunComparison:
    run: str
    a: dict[str, tuple[str, int]]  # rule → (worst severity, first firing step)
    b: dict[str, tuple[str, int]]
    critical_a: int | None  # step of the first critical alert
    critical_b: int | None
    non_finite: int | None

    @property
    def only_a(self) -> list[str]:
        return sorted(set(self.a) - set(self.b))

    @property
    def only_b(self) -> list[str]:
        return sorted(set(self.b) - set(self.a))

    @property
    def lead_difference(self) -> int | None:
        """Steps by which A's first critical came before B's (negative: B was earlier)."""
        if self.critical_a is None or self.critical_b is None:
            return None
        return self.critical_b - self.critical_a


def compare_runs(a: Sequence[RunData], b: Sequence[RunData]) -> list[RunComparison]:
    """One comparison per run seen by either replay, in A's order."""
    by_b = {r.run: r for r in b}
    out = []
    for run in a:
        other = by_b.pop(run.run, RunData(run.run, run.series))
        out.append(_compare(run, other))
    out.extend(_compare(RunData(r.run, r.series), r) for r in by_b.values())
    return out


def _compare(a: RunData, b: RunData) -> RunComparison:
    ca, cb = a.first_critical(), b.first_critical()
    return RunComparison(
        a.run,
        a.caught(),
        b.caught(),
        ca.step if ca else None,
        cb.step if cb else None,
        a.first_non_finite(),
    )


def _critical(step: int | None, nan: int | None) -> str:
    if step is None:
        return "none"
    if nan is None:
        return f"step {step}"
    return f"step {step} ({nan - step} steps before the first non-finite value)"


def _lead(c: RunComparison) -> str:
    diff = c.lead_difference
    if diff is None:
        if c.critical_a is None and c.critical_b is None:
            return "neither pack raised a critical alert"
        return f"only {'A' if c.critical_a is not None else 'B'} raised a critical alert"
    if diff == 0:
        return "same step"
    return f"{'A' if diff > 0 else 'B'} earlier by {abs(diff)} steps"


def compare_section(comparisons: Sequence[RunComparison], label_a: str, label_b: str) -> str:
    """Totals across runs, then a table per run where the packs differ at all."""
    only_a = sum(1 for c in comparisons if c.only_a)
    only_b = sum(1 for c in comparisons if c.only_b)
    out = [
        f"<h2>Comparison: A = {esc(label_a)}, B = {esc(label_b)}</h2>",
        f"<p>{len(comparisons)} run(s); A caught something B missed in {only_a}, "
        f"B caught something A missed in {only_b}.</p>",
    ]
    same: list[str] = []
    for c in comparisons:
        if not c.a and not c.b:
            same.append(c.run)
            continue
        out.append(f"<h3>{esc(c.run)}</h3>")
        out.append(
            f"<p>First critical — A: {esc(_critical(c.critical_a, c.non_finite))}; "
            f"B: {esc(_critical(c.critical_b, c.non_finite))}; <b>{esc(_lead(c))}</b>.</p>"
        )
        out.append(
            "<table><tr><th>rule</th><th>A (pack A)</th><th>B (pack B)</th><th>caught by</th></tr>"
        )
        for rule in sorted(set(c.a) | set(c.b), key=lambda r: _first(c, r)):
            cells = [_cell(c.a.get(rule)), _cell(c.b.get(rule))]
            if rule in c.a and rule in c.b:
                who, css = "both", ""
            else:
                who, css = ("only A" if rule in c.a else "only B"), ' class="only"'
            out.append(
                f"<tr{css}><td>{esc(rule)}</td><td>{cells[0]}</td><td>{cells[1]}</td>"
                f"<td>{who}</td></tr>"
            )
        out.append("</table>")
    if same:
        out.append(f'<p class="muted">No alerts under either pack: {esc(", ".join(same))}</p>')
    return "\n".join(out)


def _first(c: RunComparison, rule: str) -> int:
    steps = [x[1] for x in (c.a.get(rule), c.b.get(rule)) if x is not None]
    return min(steps)


def _cell(caught: tuple[str, int] | None) -> str:
    if caught is None:
        return '<span class="muted">missed</span>'
    return f"{sev(caught[0])} at step {caught[1]}"
