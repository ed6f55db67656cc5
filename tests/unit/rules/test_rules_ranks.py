"""Ranks of a job compared at the same step (rules/ranks.py), through the engine.

The default pack's own rules, fed the points four ranks of one job would log:
the verdicts must name the odd rank, keep healthy batch noise and a job-wide
slowdown quiet, and not depend on the order the ranks' points arrive in.
"""

from __future__ import annotations

import math
import random

import pytest

from trainsentry.alert import Transition
from trainsentry.point import Point
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules

RANKS = [f"job/rank{r}" for r in range(4)]


@pytest.fixture(scope="module")
def pack():  # type: ignore[no-untyped-def]
    return load_rules()


def ranks_logging(
    steps: int,
    value: object,
    tag: str,
    *,
    seconds_per_step: float = 0.1,
    runs: list[str] = RANKS,
) -> list[list[Point]]:
    """Per step, each rank's point: `value(rank, step)`, stamped at the job's pace."""
    out = []
    for step in range(steps):
        wall = 1_800_000_000.0 + step * seconds_per_step
        out.append(
            [Point(run, tag, step, wall, value(r, step)) for r, run in enumerate(runs)]  # type: ignore[operator]
        )
    return out


def fed(engine: Engine, by_step: list[list[Point]], order: random.Random | None = None) -> list:
    out: list[Transition] = []
    for points in by_step:
        points = list(points)
        if order is not None:
            order.shuffle(points)
        for p in points:
            out.extend(engine.feed(p))
    return out


def firings(transitions: list[Transition], rule: str) -> list[tuple[str, str, int]]:
    return [
        (t.run, t.metric, t.step) for t in transitions if t.rule == rule and t.state == "firing"
    ]


def test_a_rank_slow_to_get_its_batch_is_named_a_straggler(pack) -> None:  # type: ignore[no-untyped-def]
    noise = random.Random(1)

    def wait(rank: int, step: int) -> float:  # rank 2 waits 40 ms more from step 300
        return 0.005 * noise.uniform(0.5, 1.5) + (0.04 if rank == 2 and step >= 300 else 0.0)

    got = fed(Engine(pack), ranks_logging(1500, wait, "probe/data_wait"))
    fired = firings(got, "rank_straggler")
    assert [run for run, _, _ in fired] == ["job/rank2"]
    step = fired[0][2]
    assert 300 + 590 <= step <= 300 + 700  # a minute at 0.1 s a step, and not much later
    message = next(t.message for t in got if t.rule == "rank_straggler")
    assert "rank 2" in message and "median" in message and "of the job's 0.1 s step" in message


def test_every_rank_slowing_together_is_no_straggler(pack) -> None:  # type: ignore[no-untyped-def]
    noise = random.Random(2)

    def wait(rank: int, step: int) -> float:
        return (0.05 if step >= 300 else 0.005) * noise.uniform(0.8, 1.2)

    got = fed(Engine(pack), ranks_logging(1500, wait, "probe/data_wait"))
    assert firings(got, "rank_straggler") == []


def test_a_small_excess_on_a_long_step_is_no_straggler(pack) -> None:  # type: ignore[no-untyped-def]
    """Rank 0 waits x3 the others, 2 ms more, in a 1 s step: its logging, not a straggler."""

    def wait(rank: int, step: int) -> float:
        return 0.003 if rank == 0 else 0.001

    got = fed(Engine(pack), ranks_logging(600, wait, "data_time", seconds_per_step=1.0))
    assert firings(got, "rank_straggler") == []


def test_a_rank_whose_loss_leaves_the_others_is_named(pack) -> None:  # type: ignore[no-untyped-def]
    noise = random.Random(3)

    def loss(rank: int, step: int) -> float:
        level = 2.3 * math.exp(-step / 300) + 0.2
        if rank == 3 and step >= 400:
            return 2.3 * noise.uniform(0.9, 1.1)  # its shard is garbage: chance level
        return level * noise.uniform(0.8, 1.25)

    got = fed(Engine(pack), ranks_logging(800, loss, "loss"))
    fired = firings(got, "rank_diverged")
    assert [run for run, _, _ in fired] == ["job/rank3"]
    assert 400 <= fired[0][2] <= 500
    message = next(t.message for t in got if t.rule == "rank_diverged")
    assert "rank 3" in message and "ranks at this step" in message


def test_healthy_noisy_ranks_keep_within_their_band(pack) -> None:  # type: ignore[no-untyped-def]
    """Ranks of one or two samples each: their losses are x3 apart at many steps."""
    noise = random.Random(4)

    def loss(rank: int, step: int) -> float:
        return (2.3 * math.exp(-step / 300) + 0.2) * math.exp(noise.gauss(0, 0.5))

    got = fed(Engine(pack), ranks_logging(3000, loss, "loss"))
    assert firings(got, "rank_diverged") == []


def test_the_order_ranks_arrive_in_changes_no_verdict(pack) -> None:  # type: ignore[no-untyped-def]
    noise = random.Random(5)

    def wait(rank: int, step: int) -> float:
        return 0.005 * noise.uniform(0.5, 1.5) + (0.04 if rank == 1 and step >= 200 else 0.0)

    by_step = ranks_logging(1200, wait, "probe/data_wait")
    want = [t.as_dict() for t in fed(Engine(pack), by_step)]
    assert want
    for seed in range(3):
        got = fed(Engine(pack), by_step, order=random.Random(seed))
        assert [t.as_dict() for t in got] == want
    # one rank read far ahead of the others (its file read first, as a backfill does)
    lagging = [[p for p in points if p.run != "job/rank0"] for points in by_step]
    engine = Engine(pack)
    ahead = [Point(*p) for points in by_step for p in points if p.run == "job/rank0"]
    got = fed(engine, [ahead[:300]]) + fed(engine, lagging[:300])
    got += fed(engine, [ahead[300:]]) + fed(engine, lagging[300:])
    assert sorted(firings(got, "rank_straggler")) == sorted(
        firings([Transition.from_dict(d) for d in want], "rank_straggler")
    )


def test_runs_that_are_no_ranks_are_never_compared(pack) -> None:  # type: ignore[no-untyped-def]
    runs = ["sweep/a", "sweep/b", "sweep/c", "sweep/d"]

    def wait(rank: int, step: int) -> float:
        return 0.05 if rank == 2 else 0.005

    got = fed(Engine(pack), ranks_logging(1500, wait, "probe/data_wait", runs=runs))
    assert firings(got, "rank_straggler") == []


def test_a_rank_that_ended_no_longer_holds_the_others_back(pack) -> None:  # type: ignore[no-untyped-def]
    def wait(rank: int, step: int) -> float:
        return 0.05 if rank == 2 else 0.005

    by_step = ranks_logging(1500, wait, "probe/data_wait", runs=[*RANKS, "job/rank4"])
    engine = Engine(pack)
    got = fed(
        engine,
        [[p for p in points if p.run != "job/rank4" or p.step < 10] for points in by_step[:100]],
    )
    assert firings(got, "rank_straggler") == []  # rank 4 stopped at step 9: nothing is complete
    got = engine.finish("job/rank4")
    got += fed(engine, [[p for p in points if p.run != "job/rank4"] for points in by_step[100:]])
    assert [run for run, _, _ in firings(got, "rank_straggler")] == ["job/rank2"]


def test_alert_lines_carry_the_job_and_rank(pack) -> None:  # type: ignore[no-untyped-def]
    def wait(rank: int, step: int) -> float:
        return 0.05 if rank == 2 else 0.005

    got = fed(Engine(pack), ranks_logging(1500, wait, "probe/data_wait"))
    line = next(t for t in got if t.rule == "rank_straggler").as_dict()
    assert (line["run"], line["job"], line["rank"]) == ("job/rank2", "job", 2)


def test_a_quiet_rank_says_which_rank_of_its_job_stopped_first(pack) -> None:  # type: ignore[no-untyped-def]
    """Rank 1 stops at step 50 (its loader hangs); the others wait in the all-reduce of step
    60 with their step 59 logged: the stall names rank 1, not the rank read last."""
    engine = Engine(pack)
    for step in range(60):
        for r, run in enumerate(RANKS):
            if r == 1 and step > 50:
                continue
            engine.feed(Point(run, "loss", step, 1_800_000_000.0 + step, 2.0))
    fired = engine.tick(1_800_000_000.0 + 3600)
    stalled = {t.run: t.message for t in fired if t.rule == "run_stalled"}
    assert set(stalled) == set(RANKS)
    assert all("rank 1 of job stopped first, at step 50" in m for m in stalled.values())


def test_ranks_that_stopped_together_are_said_so(pack) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(pack)
    for step in range(60):
        for run in RANKS:
            engine.feed(Point(run, "loss", step, 1_800_000_000.0 + step, 2.0))
    fired = engine.tick(1_800_000_000.0 + 3600)
    message = next(t.message for t in fired if t.rule == "run_stalled")
    assert (
        "all 4 ranks of job stopped at step 59 within 0 s of each other: none is behind" in message
    )


def test_a_restart_of_the_daemon_keeps_the_comparisons(pack) -> None:  # type: ignore[no-untyped-def]
    """The engine is saved (pickled) with the alert state: a daemon restarted mid-job
    judges the ranks' next steps as the one before it would have."""
    import pickle

    def wait(rank: int, step: int) -> float:
        return 0.005 + (0.04 if rank == 2 and step >= 300 else 0.0)

    by_step = ranks_logging(1500, wait, "probe/data_wait")
    want = [t.as_dict() for t in fed(Engine(pack), by_step)]
    engine = Engine(pack)
    got = fed(engine, by_step[:500])
    engine = pickle.loads(pickle.dumps(engine))
    got += fed(engine, by_step[500:])
    assert [t.as_dict() for t in got] == want and want


def test_ranks_read_one_file_after_another_are_compared_as_if_read_together(pack) -> None:  # type: ignore[no-untyped-def]
    """A daemon started beside a running job reads each rank's backlog in turn: the ranks it
    follows are expected, so the first rank's steps wait for the others' instead of being
    judged alone."""

    def wait(rank: int, step: int) -> float:
        return 0.005 + (0.04 if rank == 2 and step >= 100 else 0.0)

    by_step = ranks_logging(900, wait, "probe/data_wait")
    want = firings(fed(Engine(pack), by_step), "rank_straggler")
    assert want
    engine = Engine(pack)
    for run in RANKS:
        engine.expect(run)
    got: list[Transition] = []
    for run in RANKS:  # file by file: all of rank 0, then all of rank 1, ...
        got += fed(engine, [[p for points in by_step for p in points if p.run == run]])
    assert firings(got, "rank_straggler") == want
