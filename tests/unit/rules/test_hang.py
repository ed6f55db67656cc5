"""A collective hang held until decided (rules/hang.py), through the text engine."""

from __future__ import annotations

import math
import pickle

from trainsentry.point import TextEvent
from trainsentry.rules.loader import load_rules
from trainsentry.rules.log_rules import LogEngine

TIMEOUT = (
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 10000ms for recv operation to complete"
)


def reported(engine: LogEngine, rank: int, wall: float) -> list:
    line = f"[rank{rank}]: {TIMEOUT}"
    return engine.feed([TextEvent("stderr.log", 1, wall, (line,), "line", "", f"job/rank{rank}")])


def test_held_timeouts_survive_a_restart_of_the_daemon_and_are_decided_after_it() -> None:
    """The alert state is saved (pickled) every minute: a hang held meanwhile is saved with
    it, and decided by the daemon that restores it."""
    engine = LogEngine(load_rules())
    for rank in range(4):
        engine.saw(f"job/rank{rank}", 40, 100.0)
    assert reported(engine, 0, 110.0) == [] and reported(engine, 1, 110.2) == []
    assert engine.hang.waiting
    restored: LogEngine = pickle.loads(pickle.dumps(engine))
    assert restored.tick(110.5) == []  # ranks 2 and 3 have not said anything yet
    fired = restored.tick(120.5)  # the grace is over: both are named
    [hang] = [t for t in fired if t.rule == "rank_blocked_collective"]
    assert hang.run == "job/rank2" and hang.labels["blocked"] == "rank 2,rank 3"
    assert "ranks 2 and 3 of job did not join a collective" in hang.message
    assert [t.run for t in fired if t.rule == "gloo_collective_timeout"] == [
        "job/rank0",
        "job/rank1",
    ]
    assert not restored.hang.waiting and restored.tick(math.inf) == []
