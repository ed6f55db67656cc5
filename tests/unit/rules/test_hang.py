"""A collective hang held until decided (rules/hang.py), through the text engine."""

from __future__ import annotations

import math
import pickle

from trainsentry.point import TextEvent
from trainsentry.rules.loader import load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.run_life import WRITER, Ending, RunProcess

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


def test_the_blocked_rank_killed_by_torchrun_before_the_verdict_is_still_named() -> None:
    """torchrun stops the job's other workers once a rank fails: the blocked rank's
    process is seen gone (its writer's end, no line of its own) before the second that
    settles the verdict. It said nothing: it is still the rank the others waited for."""
    engine = LogEngine(load_rules())
    for rank in range(4):
        engine.saw(f"job/rank{rank}", 40, 100.0)
    path = "/logs/job/rank2/stdout.log"
    engine.writing("job/rank2", RunProcess("h", 42, 9, "ns", path, 0, by=WRITER, command="py"))
    for rank in (0, 1, 3):
        assert reported(engine, rank, 110.0 + rank / 10) == []
    line = "process 42 (py) on host h exited with status 1"
    gone = engine.process_gone("job/rank2", path, 110.4, Ending("crashed", line))
    assert [t.rule for t in gone if t.state == "firing"] == ["process_exited"]
    [hang] = [t for t in engine.tick(111.5) if t.rule == "rank_blocked_collective"]
    assert hang.run == "job/rank2" and "rank 2 of job did not join a collective" in hang.message
