"""A job's checkpoints against its records (rules/checkpoints.py), through replay's engines:
which runs are one job's, and what a checkpoint is not (a record the run logged)."""

from __future__ import annotations

from trainsentry.backtest.replay import replay_transitions
from trainsentry.point import Point
from trainsentry.rules.checkpoints import CheckpointBook
from trainsentry.rules.loader import load_rules

PACK = load_rules()
T0 = 1_800_000_000.0


def checkpoints(run: str, steps: range | list[int], late: float = 5.0) -> list[Point]:
    return [
        Point(run, tag, s, T0 + s + late, value)
        for s in steps
        for tag, value in (("checkpoint/step", float(s)), ("checkpoint/bytes", 4e9))
    ]


def logged(run: str, steps: range, every: int = 10) -> list[Point]:
    return [Point(run, "train/loss", s, T0 + s, 1.0) for s in steps if s % every == 0]


def fired(points: list[Point]) -> list[tuple[str, str, int]]:
    return [
        (t.rule, t.run, t.step)
        for t in replay_transitions(points)
        if t.state == "firing" and t.rule.startswith("checkpoint")
    ]


def test_the_runs_at_or_below_a_checkpoint_run_are_its_job() -> None:
    book = CheckpointBook()
    for run in ("out", "job_abcd1234", "lt/version_0"):
        book.saved(run, 100, T0)
    assert book.job_of("out/runs/Jan01_host") is book.job_of("out")
    assert book.job_of("job_abcd1234/attempt_0/3") is book.job_of("job_abcd1234")
    assert book.job_of("lt/version_0") is book.job_of("lt/version_0")
    assert book.job_of("lt/version_1") is None  # a sibling is another job
    assert book.job_of("outside") is None
    assert book.related("lt") is book.job_of("lt/version_0")  # a log above its job's root


def test_hf_checkpoints_above_the_run_that_logs_are_overdue_once() -> None:
    points = checkpoints("out", range(500, 2001, 500)) + logged("out/runs/Jan01", range(6000))
    # 3 cadences: 1500 steps and 1500 s past step 2000, whose files settled 5 s after it
    assert fired(points) == [("checkpoint_overdue", "out", 3510)]


def test_a_job_restarted_from_its_checkpoint_is_not_overdue_while_its_next_ones_settle() -> None:
    """Restarted 10 minutes after its checkpoint at step 20, the job logs 20 steps in a
    fifth of a second, before its next checkpoints' files have settled: the restart's
    minutes were no work at risk, so nothing is overdue."""
    first = [Point("out/runs/a", "train/loss", s, T0 + s, 1.0) for s in range(21)]
    saved = [
        Point("out", tag, s, T0 + s + 0.5, value)
        for s in range(5, 21, 5)
        for tag, value in (("checkpoint/step", float(s)), ("checkpoint/bytes", 4e9))
    ]
    resumed = [Point("out/runs/b", "train/loss", s, T0 + 620 + s / 100, 1.0) for s in range(21, 41)]
    # its checkpoints 25 to 40, told once their files settled, 5 s after the burst
    settled = [
        p._replace(wall_time=T0 + 625 + p.step / 100) for p in checkpoints("out", range(25, 41, 5))
    ]
    assert fired(first + saved + resumed + settled) == []


def test_a_checkpoint_row_is_no_record_of_the_run() -> None:
    """A checkpoint told after the run's last record (its files settled) neither rewinds the
    run into a restart nor moves its step; a run holding only checkpoints never goes quiet
    by run_stalled: it is a folder on disk, not a job that logs."""
    points = logged("lt/version_0", range(3001)) + checkpoints(
        "lt/version_0", range(1000, 3001, 1000), late=60
    )
    points += checkpoints("out", [1000, 2000, 3000, 4000, 90_000])  # 20 intervals' silence
    got = replay_transitions(points, PACK)
    assert [(t.rule, t.run) for t in got if t.state == "firing"] == []
