"""A run's job, rank and attempt, from the paths launchers and jobs write (jobs/identity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsentry.jobs import member_of, rank_in_name, same_job
from trainsentry.jobs.identity import rank_of_line
from trainsentry.sources.discover import Root


@pytest.mark.parametrize(
    ("run", "job", "group", "rank", "attempt"),
    [
        ("exp", "exp", "exp", None, None),
        ("exp/rank3", "exp", "exp", 3, None),
        ("exp/rank_3", "exp", "exp", 3, None),
        # torchrun --log-dir: <rdzv id>_<mkdtemp suffix>/attempt_<N>/<local rank>
        ("logs/job42_k2j4h5g6/attempt_1/3", "logs/job42", "logs/job42_k2j4h5g6/attempt_1", 3, 1),
        ("logs/job42_k2j4h5g6/attempt_0", "logs/job42", "logs/job42_k2j4h5g6/attempt_0", None, 0),
        # torchrun's default rendezvous id is shared by unrelated jobs: the agent's own dir
        (
            "logs/none_k2j4h5g6/attempt_0/0",
            "logs/none_k2j4h5g6",
            "logs/none_k2j4h5g6/attempt_0",
            0,
            0,
        ),
        # a name that only looks like an agent's is a run of its own
        (
            "sweep/lr_sweep_baseline",
            "sweep/lr_sweep_baseline",
            "sweep/lr_sweep_baseline",
            None,
            None,
        ),
        ("exp/attempt_2/rank1", "exp", "exp/attempt_2", 1, 2),
        ("rank3", "rank3", "rank3", None, None),  # the root itself: nothing above to be a job
        ("x/rank_1000000", "x/rank_1000000", "x/rank_1000000", None, None),  # no job has 10^6
    ],
)
def test_a_run_id_says_its_job_rank_and_attempt(run, job, group, rank, attempt) -> None:  # type: ignore[no-untyped-def]
    member = member_of(run)
    assert (member.job, member.group, member.rank, member.attempt) == (job, group, rank, attempt)


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank_3.jsonl", 3),
        ("metrics.rank3.jsonl", 3),
        ("trainsentry-probe.rank12.jsonl", 12),
        ("train-rank-2.log", 2),
        ("slurm-1234-3.out", 3),  # --output=slurm-%j-%t.out
        ("slurm-1234.3.err", 3),
        ("slurm-1234_3.out", None),  # an array task (%A_%a): a job of its own
        ("frank3.log", None),
        ("cranky.log", None),
        ("train.log", None),
        ("rank1000000000.jsonl", None),  # a rank of 10^9 is no rank
    ],
)
def test_a_file_name_says_its_rank(name: str, rank: int | None) -> None:
    assert rank_in_name(name) == rank


def test_lines_say_their_rank() -> None:
    assert rank_of_line("[rank3]: Traceback (most recent call last):") == 3
    assert rank_of_line("[default1]:{'loss': 1.2}") == 1
    assert rank_of_line("[E1016 03:31:38 ProcessGroupNCCL.cpp:607] x") is None
    assert rank_of_line("plain line") is None


def test_ranks_and_attempts_of_a_job_are_one_job() -> None:
    assert same_job("exp/rank1", "exp/rank3") and same_job("exp", "exp/rank3")
    a, b = "logs/j_k2j4h5g6/attempt_0/1", "logs/j_zzzzzzzz/attempt_2/0"
    assert same_job(a, b)  # two agents (nodes, or a requeue) of rendezvous id j
    assert same_job(a, "logs")  # the launcher's own log above them
    assert not same_job("sweep/a", "sweep/b") and not same_job("a/b", "a/bc")
    assert same_job("a/b", "a/b/logs") and same_job("a/b/c/d", "a/b")


def test_files_named_with_a_rank_are_runs_of_their_own(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    for name in ("rank_0.jsonl", "rank_1.jsonl", "trainsentry-probe.rank1.jsonl", "train.log"):
        (exp / name).write_text("")
    (exp / "rank2").mkdir()
    (exp / "rank2" / "metrics.rank2.jsonl").write_text("")  # in its rank's dir: not rank2/rank2
    runs = {f.path.name: f.run for f in Root.watched(tmp_path).scan()}
    assert runs == {
        "rank_0.jsonl": "exp/rank0",
        "rank_1.jsonl": "exp/rank1",
        "trainsentry-probe.rank1.jsonl": "exp/rank1",
        "train.log": "exp",
        "metrics.rank2.jsonl": "exp/rank2",
    }
