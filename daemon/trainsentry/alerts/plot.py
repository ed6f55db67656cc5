"""A small PNG of the series around the alert: what the rule saw, at a glance.

Drawn from the incident bundle (the points as they were when the alert
fired), once per incident, beside the bundle: `Plotter` draws every new
bundle's in a child process, so a person reading `incidents/` the next
morning finds the picture whether or not any receiver took attachments; a
receiver that takes them gets the same file (`plot_incident`).

Why a child process: matplotlib costs the process that imports it ~60 MB and
a second (measured), a fifth of a 1,000-run fleet's whole daemon, for a few
pictures a day. The delivery worker of a receiver that takes attachments
still draws in-process when the child has not yet. matplotlib is imported
here and only here, with the Agg backend and its object API (no pyplot): no
display, no global figure state shared between worker threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PLOT_LOCK = threading.Lock()  # matplotlib's font cache and text layout are not thread-safe
POINTS_SHOWN = 300
QUEUED_AT_MOST = 100  # bundles waiting for their plot; a storm's beyond are drawn on demand
CHILD_TIMEOUT_SECONDS = 120.0


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
    with PLOT_LOCK:
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
        if finite and min(v for _, v in finite) > 0 and spans_decades(finite):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{alert.get('run', '')} · {alert.get('metric', '')}", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        tmp = out.with_suffix(".png.tmp")
        fig.savefig(tmp, format="png")
        tmp.replace(out)


def spans_decades(points: list[tuple[int, float]]) -> bool:
    values = [v for _, v in points]
    return max(values) / min(values) > 100


class Plotter:
    """Draws the PNG of every new incident bundle, a batch per child process, off the loop."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Path | None] = queue.Queue(QUEUED_AT_MOST)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainsentry-plots", daemon=True)
        self._thread.start()

    def draw(self, bundle: Path) -> None:
        """Queue `bundle`'s plot; never waits (a full queue leaves it to be drawn on demand)."""
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(bundle)

    def stop(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < QUEUED_AT_MOST:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            bundles = [str(b) for b in batch if b is not None]
            if bundles:
                self._draw(bundles)
            if None in batch:
                return

    def _draw(self, bundles: list[str]) -> None:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "trainsentry.alerts.plot", *bundles],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CHILD_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not draw %d incident plot(s): %s", len(bundles), exc)
            return
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip()[-300:]
            log.warning("could not draw %d incident plot(s): %s", len(bundles), why)


def main(bundles: list[str]) -> int:
    """The child process: each bundle's PNG beside it."""
    failed = 0
    for bundle in bundles:
        try:
            plot_incident(Path(bundle))
        except Exception as exc:  # one bad bundle must not cost the others their plot
            failed += 1
            print(f"{bundle}: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
