"""A run's files read live in any chunks and interleaving leave the merge in replay's
order (heapq.merge by reading.wall_order), steps whole; a file that stops growing
holds nothing back."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import Row
from trainsentry.runtime.run_merge import RunMerge
from trainsentry.sources.reading import wall_order
from trainsentry.state.db import Checkpoint

RUN = "job/run"


def file_rows(index: int, every: int, steps: int) -> list[Row]:
    """A writer's file: a value every `every` steps, stamped a little after the other
    files' values of its step (one process logs a step's series one after another)."""
    tag = (f"series{index}",)
    return [Row(s, 1000.0 + s + index * 1e-3, tag, (float(s),)) for s in range(0, steps, every)]


def merged_rows(files: list[list[Row]]) -> list[Row]:
    """What replay makes of these files (reading.iter_points)."""
    return list(heapq.merge(*files, key=wall_order))


def at(offset: int) -> Checkpoint:
    return Checkpoint(path="f", dev=0, ino=0, fingerprint="", behind=0, offset=offset)


@st.composite
def reads(draw: st.DrawFn) -> tuple[list[list[Row]], list[tuple[int, list[Row]]]]:
    """Files of one run, and the reads a live daemon might make of them: each file in
    chunks of any size, the chunks of all files interleaved in any order."""
    steps = draw(st.integers(1, 60))
    everies = draw(st.lists(st.sampled_from([1, 1, 2, 7]), min_size=2, max_size=4))
    files = [file_rows(i, every, steps) for i, every in enumerate(everies)]
    chunks: list[list[list[Row]]] = []
    for rows in files:
        cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=6)))
        bounds = [0, *cuts, len(rows)]
        chunks.append([rows[a:b] for a, b in itertools.pairwise(bounds)])
    order = draw(st.permutations([i for i, c in enumerate(chunks) for _ in c]))
    taken = [0] * len(files)
    out = []
    for i in order:  # each file's chunks in its own order, the files interleaved
        out.append((i, chunks[i][taken[i]]))
        taken[i] += 1
    return files, out


@settings(max_examples=300, deadline=None)
@given(reads())
def test_any_chunks_and_interleaving_come_out_in_replays_order(
    case: tuple[list[list[Row]], list[tuple[int, list[Row]]]],
) -> None:
    files, chunks = case
    merge = RunMerge(grace=2.0)
    now = 0.0  # no wait runs out: only the files' own steps let rows go
    for i in range(len(files)):  # the daemon finds the files as the job makes them
        assert merge.add(RUN, f"f{i}", [], now=now, more=False, before=None) == []
    judged: list[Row] = []
    steps_judged: list[list[Row]] = []
    for i, rows in chunks:
        released = merge.add(RUN, f"f{i}", rows, now=now, more=False, before=at(0))
        judged.extend(released)
        steps_judged.append(released)
    for _, rows in merge.flush():
        judged.extend(rows)
        steps_judged.append(rows)
    assert judged == merged_rows(files)
    assert not merge.holding
    # a step's values leave together, so the engine judges them as one moment
    handed = [rows for rows in steps_judged if rows]
    for before, after in itertools.pairwise(handed):
        assert before[-1].step != after[0].step


def test_a_file_that_stops_growing_holds_the_others_only_for_the_grace() -> None:
    merge = RunMerge(grace=2.0)
    validation = [Row(49, 1049.5, ("val/loss",), (1.0,))]
    train = [Row(s, 1000.0 + s, ("loss",), (1.0,)) for s in range(50, 60)]
    assert merge.add(RUN, "train", [], now=0.0, more=False, before=None) == []
    assert merge.add(RUN, "validation", validation, now=0.0, more=False, before=at(0)) == []
    # validation reached step 49 and train writes on: its rows after 49 wait a moment
    assert merge.add(RUN, "train", train[:5], now=0.5, more=False, before=at(0)) == validation
    assert merge.holding and merge.due(0.5) == 2.0  # validation counts as written until 2.0
    assert merge.release(1.9) == []
    assert merge.release(2.1) == [(RUN, train[:5])]
    assert not merge.holding
    # quiet since: the train file's next rows are not held at all
    assert merge.add(RUN, "train", train[5:], now=2.5, more=False, before=at(5)) == train[5:]


def test_no_row_waits_longer_than_the_grace() -> None:
    """Files stamped by clocks that disagree (another host's, a minute behind) never
    catch up with each other; the grace bounds what that costs."""
    merge = RunMerge(grace=2.0)
    here = [Row(s, 1000.0 + s, ("loss",), (1.0,)) for s in range(1, 5)]
    behind = [Row(s, 940.0 + s + 0.5, ("lr",), (1.0,)) for s in range(1, 5)]
    for key in ("here", "behind"):
        merge.add(RUN, key, [], now=0.0, more=False, before=None)
    assert merge.add(RUN, "behind", behind[:1], now=0.0, more=False, before=at(0)) == []
    assert merge.add(RUN, "here", here, now=0.1, more=False, before=at(0)) == [behind[0], here[0]]
    assert merge.add(RUN, "behind", behind[1:2], now=1.0, more=False, before=at(1)) == [
        behind[1],
        here[1],
    ]
    assert merge.release(2.0) == []  # behind is written still, here's rows are young
    assert merge.release(2.2) == [(RUN, here[2:])]


def test_a_single_file_is_never_held_and_its_rows_are_not_copied() -> None:
    merge = RunMerge()
    rows = [Row(s, 1000.0 + s, ("loss",), (1.0,)) for s in range(3)]
    assert merge.add(RUN, "only", rows, now=0.0, more=False, before=at(0)) is rows
    assert merge.safe("only", RUN) is None


def test_the_committed_position_of_a_held_file_is_before_its_first_held_row() -> None:
    merge = RunMerge()
    for key in ("lr", "loss"):
        merge.add(RUN, key, [], now=0.0, more=False, before=None)
    lr = Row(1, 1001.0, ("lr",), (1.0,))
    assert merge.add(RUN, "lr", [lr], now=0.0, more=False, before=at(0)) == []
    assert merge.safe("lr", RUN) == at(0)
    ahead = [Row(s, 1000.0 + s + 0.1, ("loss",), (1.0,)) for s in (1, 2, 3)]
    assert merge.add(RUN, "loss", ahead, now=0.0, more=False, before=at(10)) == [lr, ahead[0]]
    assert merge.safe("lr", RUN) is None
    assert merge.safe("loss", RUN) == at(10)  # partly judged: all of it read again after a crash
    merge.add(RUN, "lr", [Row(3, 1003.0, ("lr",), (1.0,))], now=0.1, more=False, before=at(5))
    assert merge.safe("loss", RUN) is None and merge.safe("lr", RUN) is None
    merge.forget(RUN, "lr")
    merge.forget(RUN, "loss")
    assert not merge.holding
