"""A step is one moment: no order of a step's values, nor of a run's files, changes a verdict.

Trackers write one step's tags in their own orders (W&B's, MLflow's file store one
file per metric, tensorboardX event by event), and a run's files are read in
whatever interleaving they were flushed in. The default pack on one run, with an lr
×100 jump at step 905 that spikes the loss in the same step (loss_spike and
lr_jump, one family: the critical inhibits the warning), a NaN gradient norm later
and a validation loss beside it, must give the same transitions whichever way its
values come, and never show an alert that fired and was inhibited in one step.
"""

from __future__ import annotations

import heapq
import math
import random
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.alert import Transition
from trainsentry.backtest.replay import replay_transitions
from trainsentry.point import Point, Row
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules
from trainsentry.sources.reading import wall_order

PACK = load_rules()
RUN = "exp/run-1"
T0 = 1_800_000_000.0
TAGS = ("loss", "lr", "grad_norm", "val_loss", "epoch")


def steps() -> list[dict[str, float]]:
    """One record per 5 steps: what a healthy run logs, then the jump and a NaN."""
    rng = random.Random(7)
    out = []
    for step in range(0, 1400, 5):
        jumped = step >= 905
        loss = 2.0 * math.exp(-step / 300) + 0.3 + rng.gauss(0, 0.01)
        record = {
            "step": float(step),
            "loss": loss * (12.0 if step == 905 else 4.0 if jumped else 1.0),
            "lr": 1e-3 * (100 if jumped else 1),
            "grad_norm": math.nan if step >= 1200 else 1.0 + rng.gauss(0, 0.05),
            "epoch": step / 100,
        }
        if step % 100 == 0:
            record["val_loss"] = loss * 1.1
        out.append(record)
    return out


RECORDS = steps()


def points(files: dict[str, int], order: random.Random) -> list[Point]:
    """The run's points as `iter_points` would give them: each file (a set of tags) in
    its own order, a step's tags shuffled within it, files merged by wall time."""
    by_file: dict[int, list[Point]] = {}
    for record in RECORDS:
        step = int(record["step"])
        wall = T0 + step // 10  # two records a stamp: MLflow's milliseconds hold several steps
        tags = [t for t in TAGS if t in record]
        order.shuffle(tags)
        for tag in tags:
            by_file.setdefault(files[tag], []).append(Point(RUN, tag, step, wall, record[tag]))
    parts = [by_file[k] for k in sorted(by_file, key=lambda _: order.random())]
    return list(heapq.merge(*parts, key=wall_order))


def verdicts(ts: list[Transition]) -> list[tuple[object, ...]]:
    return [(t.rule, t.metric, t.state, t.severity, t.step, t.reason) for t in ts]


ONE_FILE = dict.fromkeys(TAGS, 0)
BASELINE = verdicts(replay_transitions(points(ONE_FILE, random.Random(0)), PACK, order="input"))


def test_the_scenario_pages_the_jump_and_the_nan_and_hides_the_inhibited_spike() -> None:
    fired = [(rule, step) for rule, _, state, _, step, _ in BASELINE if state == "firing"]
    assert ("lr_jump", 905) in fired
    assert ("loss_spike", 905) not in fired  # inhibited within its step: never shown
    assert any(rule == "grad_norm_non_finite" for rule, _ in fired)
    same_step = {
        (rule, metric, step)
        for rule, metric, state, _, step, _ in BASELINE
        if state == "firing"
        and (rule, metric, "resolved", step) in {(r, m, s, st_) for r, m, s, _, st_, _ in BASELINE}
    }
    assert same_step == set(), "fired and resolved in one step"


@settings(max_examples=40, deadline=None)
@given(
    files=st.fixed_dictionaries({tag: st.integers(0, 2) for tag in TAGS}),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_order_of_a_steps_tags_nor_of_a_runs_files_changes_a_verdict(
    files: dict[str, int], seed: int
) -> None:
    got = replay_transitions(points(files, random.Random(seed)), PACK, order="input")
    assert verdicts(got) == BASELINE


def live(cuts: list[int], seed: int) -> list[Transition]:
    """The run's one file read live: its records in reads that end where `cuts` say,
    anywhere within a step (a writer flushes when its queue fills, not where a step
    ends), each read fed as the daemon feeds it."""
    engine = Engine(PACK)
    rows = [Row(p.step, p.wall_time, (p.tag,), (p.value,)) for p in points(ONE_FILE, Random(seed))]
    ends = sorted({min(c, len(rows)) for c in cuts} | {len(rows)})
    out: list[Transition] = []
    start = 0
    for n, end in enumerate(ends):
        out += engine.feed_rows(RUN, rows[start:end], now=float(n))
        start = end
    return out + engine.settle(math.inf) + engine.finish_all()


def same(got: list[Transition]) -> None:
    """The baseline's verdicts; the run's end resolves what fires in the order its
    alerts were made, which is no verdict."""
    ended = [v for v in BASELINE if v[-1] == "run finished"]
    seen = verdicts(got)
    assert seen[: -len(ended)] == BASELINE[: -len(ended)]
    assert sorted(seen[-len(ended) :]) == sorted(ended)


def test_a_read_cut_anywhere_in_the_jumps_step_changes_no_verdict() -> None:
    """Cut between the loss and the lr of step 905, the loss judged alone would fire the
    spike that the lr's jump, read next, inhibits: a step left open waits for the rest."""
    for seed in range(4):
        at = [k for k, p in enumerate(points(ONE_FILE, Random(seed))) if p.step == 905]
        for cut in range(at[0], at[-1] + 2):
            same(live([cut], seed))


@settings(max_examples=20, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(RECORDS) * len(TAGS)), max_size=300),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_live_reads_of_a_runs_file_change_a_verdict(cuts: list[int], seed: int) -> None:
    same(live(cuts, seed))


def test_an_open_step_is_judged_once_its_writer_has_been_quiet() -> None:
    engine = Engine(PACK)
    rows = [Row(s, T0 + s, ("loss", "lr"), (1.0, 1e-3)) for s in range(10)]
    assert engine.feed_rows(RUN, rows, now=0.0) == []
    nan = Row(10, T0 + 10, ("loss",), (math.nan,))  # its lr not read yet
    assert engine.feed_rows(RUN, [nan], now=1.0) == []
    assert engine.settle(1.0) == []  # left at 1.0: not before it
    [page] = [t for t in engine.settle(6.0) if t.state == "firing"]
    assert (page.rule, page.step) == ("loss_non_finite", 10)


def test_a_record_of_another_kind_at_its_own_step_is_judged_at_once() -> None:
    """An evaluation's line between training steps holds none of their tags: whole."""
    engine = Engine(PACK)
    rows = [Row(s, T0 + s, ("loss", "grad_norm"), (1.0, 1.0)) for s in range(10)]
    assert engine.feed_rows(RUN, rows, now=0.0) == []
    out = engine.feed_rows(RUN, [Row(10, T0 + 10, ("val_loss",), (math.nan,))], now=1.0)
    assert [(t.rule, t.metric, t.step) for t in out if t.state == "firing"] == [
        ("loss_non_finite", "val_loss", 10)
    ]
