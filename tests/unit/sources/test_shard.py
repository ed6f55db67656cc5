"""`--shard i/n`: every run owned by exactly one daemon, the same answer on every host."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from trainsentry.sources.shard import ALL, Shard, ShardError, parse_shard, shard_of

RUNS = [f"team{t}/exp{e}/seed{s}" for t in range(5) for e in range(40) for s in range(5)]


def test_i_of_n_is_parsed_and_printed_back() -> None:
    assert parse_shard("2/4") == Shard(2, 4)
    assert parse_shard(" 1 / 1 ") == ALL
    assert str(Shard(3, 8)) == "3/8"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0/4", "shard 0 of 4 does not exist (shards are numbered 1..4)"),
        ("5/4", "shard 5 of 4 does not exist"),
        ("1/0", "the count must be 1..4096, got 0"),
        ("2", "expected `i/n` with 1 <= i <= n, like `1/4`, got '2'"),
        ("a/b", "got 'a/b'"),
        ("-1/4", "got '-1/4'"),
    ],
)
def test_a_shard_that_does_not_exist_is_refused_saying_why(text: str, expected: str) -> None:
    with pytest.raises(ShardError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_shard(text)


def test_every_run_is_owned_by_exactly_one_shard() -> None:
    shards = [Shard(i, 4) for i in range(1, 5)]
    for run in RUNS:
        assert sum(s.owns(run) for s in shards) == 1
    assert all(ALL.owns(run) for run in RUNS)


def test_runs_are_spread_evenly() -> None:
    counts = Counter(shard_of(run, 4) for run in RUNS)
    assert set(counts) == {1, 2, 3, 4}
    assert min(counts.values()) > len(RUNS) / 4 * 0.8


def test_the_owner_is_pinned_so_an_upgrade_cannot_move_runs() -> None:
    # If this changes, every fleet reshuffles its runs on upgrade: do not change the hash.
    runs = ["exp1/seed0", "exp1/seed1", "exp2/seed0", "bert/large/run-17", "a"]
    assert [shard_of(r, 4) for r in runs] == [1, 1, 4, 2, 4]
    assert [shard_of(r, 7) for r in runs] == [5, 1, 4, 2, 4]


def test_the_owner_is_the_same_in_another_process() -> None:
    # hash() is salted per process; a stable hash must not be.
    code = "from trainsentry.sources.shard import shard_of; print(shard_of('exp1/seed0', 7))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout
    assert out.strip() == str(shard_of("exp1/seed0", 7))


def test_adding_a_daemon_moves_only_the_runs_it_takes_over() -> None:
    before = {run: shard_of(run, 4) for run in RUNS}
    after = {run: shard_of(run, 5) for run in RUNS}
    moved = [run for run in RUNS if before[run] != after[run]]
    assert all(after[run] == 5 for run in moved)  # nothing moves between the old four
    assert len(moved) < len(RUNS) / 5 * 1.3
