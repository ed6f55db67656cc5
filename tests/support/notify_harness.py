"""The notifier with its outbox on a hand-set clock, and sinks that record instead of sending.

Grouping, repeats, rate limits, the outbox and the actions are all judged by
what reaches a sink and when; a real clock would make those tests sleep, a
real service would make them depend on the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from support.clock import Clock
from trainsentry.alert import Transition
from trainsentry.alerts.notifier import Notifier
from trainsentry.alerts.outbox import Outbox
from trainsentry.alerts.route import Route
from trainsentry.sinks.base import Message, SendResult
from trainsentry.store import Store

T0 = 1_800_000_000.0


@dataclass
class RecordingSink:
    name: str = "recording"
    takes_attachments: bool = False
    messages: list[Message] = field(default_factory=list)
    results: list[SendResult] = field(default_factory=list)

    def send(self, message: Message) -> SendResult:
        self.messages.append(message)
        return self.results.pop(0) if self.results else SendResult.success()


def transition(
    state: str = "firing", severity: str = "warning", rule: str = "loss_spike", **kw: object
) -> Transition:
    fields: dict[str, object] = {
        "run": "exp1/seed0",
        "rule": rule,
        "severity": severity,
        "state": state,
        "step": 100,
        "wall_time": T0,
        "metric": "train/loss",
        "value": 9.5,
        "message": "loss at step 100 is 9.5, above the threshold 5",
        "canonical": "loss",
    }
    fields.update(kw)
    return Transition(**fields)  # type: ignore[arg-type]


class Harness:
    def __init__(self, tmp: Path, *routes: Route, store: Store | None = None) -> None:
        self.clock = Clock(T0)
        self.routes = routes or (Route("apprise", "json://127.0.0.1:1/a"),)
        self.sinks = {r.receiver: RecordingSink(name=r.url) for r in self.routes}
        self.outbox = Outbox(tmp / "state.db", clock=self.clock)
        self.notifier = Notifier(
            self.routes,
            self.outbox,
            state_dir=tmp,
            store=store,
            clock=self.clock,
            sinks=dict(self.sinks),
        )

    def sink(self, i: int = 0) -> RecordingSink:
        return self.sinks[self.routes[i].receiver]

    def deliver(self) -> None:
        """Let every worker send what is due now, as its thread would."""
        now = self.clock.now
        for lane in self.notifier.lanes.values():
            while True:
                nxt = lane.step(now)
                if nxt is None or nxt > now:
                    break

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.notifier.tick()
        self.deliver()
