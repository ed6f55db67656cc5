"""`trainsentry notify-test`: a made-up alert through real routes, before a real one needs them.

The sample goes the way a real alert goes — incident bundle, plot, message
rendering, the route's sink — but straight to the sink, not through the
outbox: the question is "does this route work now?", answered per route with
the sink's own verdict (and whether a failure would be retried).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from trainsentry.alert import Notice, Transition
from trainsentry.alerts.dispatch import render
from trainsentry.alerts.incident import write_bundle
from trainsentry.alerts.message import link_for
from trainsentry.alerts.notifier import make_sink
from trainsentry.alerts.outbox_rows import OutboxRow
from trainsentry.alerts.route import Route
from trainsentry.point import Point
from trainsentry.sinks.base import SendResult
from trainsentry.store import Store

RUN = "trainsentry-notify-test/run0"


def sample_transition(now: float) -> tuple[Transition, Store]:
    """A gradient norm growing ×1.08 per step from step 0 to 60, fired at 60."""
    store = Store()
    for step in range(61):
        wall = now - (60 - step) * 2.0
        store.add(Point(RUN, "train/grad_norm", step, wall, 0.5 * math.exp(0.08 * step)))
        store.add(Point(RUN, "train/loss", step, wall, 2.0 - 0.01 * step))
    last = store.last_point(RUN, "train/grad_norm")
    assert last is not None
    t = Transition(
        run=RUN,
        rule="grad_norm_exponential_growth",
        severity="critical",
        state="firing",
        step=60,
        wall_time=last.wall_time,
        metric="train/grad_norm",
        value=last.value,
        message="grad_norm at step 60 grew ×120 in 60 steps (R² 1.00); "
        "projected to pass 100 in ~6 steps (this is a test from trainsentry notify-test)",
        canonical="grad_norm",
        family="grad_norm",
        runbook="Nothing to do: this is a test notification.",
    )
    return t, store


def send_sample(
    routes: Sequence[Route], link_template: str | None = None
) -> list[tuple[str, SendResult]]:
    now = time.time()
    t, store = sample_transition(now)
    results: list[tuple[str, SendResult]] = []
    with tempfile.TemporaryDirectory(prefix="trainsentry-notify-test-") as tmp:
        bundle = write_bundle(
            Path(tmp), t, store, {"run": RUN, "sample": True}, {"threshold": 100.0}
        )
        notice = Notice(
            t, "firing", now, since=now - 30.0, threshold=100.0, incident=str(bundle),
            link=link_for(link_template, t),
        )  # fmt: skip
        row = OutboxRow("notify-test", "", RUN, "critical", notice, now, now)
        for route in routes:
            sink = make_sink(route)
            try:
                result = sink.send(render([row], sink.takes_attachments, now))
            except Exception as exc:
                result = SendResult.fatal(f"{type(exc).__name__}: {exc}")
            results.append((sink.name, result))
    return results
