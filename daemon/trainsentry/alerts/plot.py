"""A small PNG of the series around the alert: what the rule saw, at a glance.

Rendered by the delivery worker from the incident bundle (the points as they
were when the alert fired), once per incident, and only for receivers that
take attachments. matplotlib is imported here and only here, with the Agg
backend and its object API (no pyplot): no display, no global figure state
shared between worker threads.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()  # matplotlib's font cache and text layout are not thread-safe
POINTS_SHOWN = 300


def plot_incident(bundle_path: Path) -> Path | None:
    """`<bundle>.png` beside the bundle, rendered on first use; None if there is nothing to plot."""
    png = bundle_path.with_suffix(".png")
    if png.exists():
        return png
    try:
        bundle = json.loads(bundle_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    alert = bundle.get("alert", {})
    points = bundle.get("series", {}).get(alert.get("metric"), [])
    if not points:
        return None
    render(points[-POINTS_SHOWN:], png, alert, bundle.get("threshold"))
    return png


def _value(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else float(str(v))


def render(points: list[list[Any]], out: Path, alert: dict[str, Any], threshold: Any) -> None:
    """points: [step, wall_time, value]; non-finite values marked on the top edge in red."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [int(p[0]) for p in points]
    values = [_value(p[2]) for p in points]
    finite = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    with _LOCK:
        fig = Figure(figsize=(6.4, 3.2), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if finite:
            ax.plot([s for s, _ in finite], [v for _, v in finite], lw=1.2, color="#1f77b4")
        bad = [s for s, v in zip(steps, values, strict=True) if not math.isfinite(v)]
        if bad:
            top = max((v for _, v in finite), default=1.0)
            ax.scatter(bad, [top] * len(bad), marker="x", color="red", label="non-finite")
        if isinstance(threshold, (int, float)) and math.isfinite(threshold):
            ax.axhline(threshold, color="orange", ls="--", lw=1, label=f"threshold {threshold:g}")
        step = alert.get("step")
        if isinstance(step, int):
            ax.axvline(step, color="red", lw=1, alpha=0.6, label=f"firing at step {step}")
        if finite and min(v for _, v in finite) > 0 and _spans_decades(finite):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{alert.get('run', '')} · {alert.get('metric', '')}", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        tmp = out.with_suffix(".png.tmp")
        fig.savefig(tmp, format="png")
        tmp.replace(out)


def _spans_decades(points: list[tuple[int, float]]) -> bool:
    values = [v for _, v in points]
    return max(values) / min(values) > 100
