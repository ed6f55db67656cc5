"""One PNG per plotted series, returned as a data URI for the report.

The style is the alert attachment's (alerts/plot.py): the same Agg object
API without pyplot, the same lock around matplotlib, colours and the same
log-scale rule, so an alert's picture and its backtest read the same. What
is added is what a backtest has and an alert does not: the whole run, every
firing span shaded by severity, the first firing marked, and the growth
fit drawn through the window the rule fitted.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainsentry.alert import Transition
from trainsentry.alerts.plot import PLOT_LOCK, spans_decades
from trainsentry.backtest.data import FiringSpan, growth_fit

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SHADE = {"critical": "#d62728", "warning": "#ff9f1a"}  # red, amber
LINE = "#1f77b4"


def render_series(
    title: str,
    points: Sequence[tuple[int, float]],
    spans: Sequence[FiringSpan],
    first: Transition | None,
    thresholds: Sequence[tuple[float, str]],
    growth: Sequence[Transition] = (),
) -> str:
    """`data:image/png;base64,...` of one series (already downsampled).

    thresholds: (value, label) lines to draw. growth: firing transitions of
    growth rules on this series; the fit of the first one is drawn if its
    message carries one.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    finite = [(s, v) for s, v in points if math.isfinite(v)]
    bad = [s for s, v in points if not math.isfinite(v)]
    with PLOT_LOCK:
        fig = Figure(figsize=(6.4, 2.6), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if finite:
            ax.plot([s for s, _ in finite], [v for _, v in finite], lw=1.1, color=LINE)
        top = max((v for _, v in finite), default=1.0)
        if bad:
            ax.scatter(bad, [top] * len(bad), marker="x", color="red", s=18, label="non-finite")
        shaded: set[str] = set()
        for span in spans:
            label = None if span.severity in shaded else f"{span.severity} firing"
            shaded.add(span.severity)
            end = span.end if span.end > span.start else span.start + 0.5
            colour = SHADE.get(span.severity, "#999999")
            ax.axvspan(span.start, end, color=colour, alpha=0.18, lw=0, label=label)
        if first is not None:
            ax.axvline(first.step, color="red", lw=1, alpha=0.7, ls=":")
            steps = [s for s, _ in points] or [first.step]
            right = first.step > (min(steps) + max(steps)) / 2  # label left of the line there
            ax.annotate(
                f"first: {first.rule} @ {first.step}",
                (first.step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3 if right else 3, -10),
                textcoords="offset points",
                ha="right" if right else "left",
                fontsize=7,
                color="#b00000",
            )
        for value, label in thresholds:
            ax.axhline(value, color="orange", ls="--", lw=1, label=label)
        for t in growth[:1]:
            _draw_fit(ax, points, t)
        positive = [(s, v) for s, v in finite if v > 0]
        if positive and len(positive) == len(finite) and spans_decades(positive):
            ax.set_yscale("log")
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _draw_fit(ax: Axes, points: Sequence[tuple[int, float]], t: Transition) -> None:
    fit = growth_fit(points, t)
    if fit is None:
        return  # the message had no fit ("too few points"): nothing honest to draw
    first, last, slope, intercept = fit
    xs = [first + (last - first) * i / 20 for i in range(21)]
    ys = [math.exp(intercept + slope * x) for x in xs]
    label = f"growth fit ×{math.exp(slope * (last - first)):.3g} in {last - first} steps"
    ax.plot(xs, ys, color="#2ca02c", lw=1.6, label=label)
