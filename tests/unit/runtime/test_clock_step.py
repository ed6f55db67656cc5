"""Live no-data checks when the wall clock is stepped by hours while the daemon runs.

The clocks are injected (a wall clock that is stepped, a monotonic one that
is not), as NTP stepping a node's clock would leave them; the engine and the
rules are the real ones.
"""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.series import WALL0, points, ruleset

from trainsentry.alert import Transition
from trainsentry.point import Point, Row, batches_of
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules
from trainsentry.runtime.silence_clock import SilenceClock, _live

HOUR = 3600.0
RULES = ruleset("- {name: stalled, no_data: {factor: 20, min_silence: 15m}}")


class Clocks:
    def __init__(self) -> None:
        self.wall = WALL0 + 100.0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def live_runs(clocks: Clocks, runs: int = 5) -> tuple[Engine, SilenceClock]:
    """Runs that each logged a step a second up to just now."""
    engine = Engine(RULES)
    silence = SilenceClock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    for r in range(runs):
        batch = points("1x100", run=f"run{r}")
        assert engine.feed_all(batch) == []
        for run, rows in batches_of(batch):
            silence.arrived(run, rows)
    return engine, silence


@pytest.mark.parametrize("step", [3 * HOUR, -3 * HOUR])
def test_a_stepped_wall_clock_raises_no_stalled_alert_on_live_runs(step: float) -> None:
    clocks = Clocks()
    engine, silence = live_runs(clocks)
    clocks.wall += step
    for _ in range(10):  # ten loop cycles, a second apart
        clocks.advance(1.0)
        assert engine.tick(silence.look(), silence.now_of) == []
    # what time.time() alone does: a forward step is a storm, one alert per live run
    stormed = engine.tick(clocks.wall)
    assert len(stormed) == (5 if step > 0 else 0)


@pytest.mark.parametrize("step", [3 * HOUR, -3 * HOUR])
def test_a_run_that_really_stops_after_a_step_is_caught_when_its_silence_is_due(
    step: float,
) -> None:
    clocks = Clocks()
    engine, silence = live_runs(clocks, runs=1)
    clocks.wall += step
    clocks.advance(14 * 60)
    assert engine.tick(silence.look(), silence.now_of) == []
    clocks.advance(2 * 60)  # 16 minutes of real silence: past the 15-minute floor
    fired = engine.tick(silence.look(), silence.now_of)
    assert [(t.rule, t.state) for t in fired] == [("stalled", "firing")]
    # stamped on the data's own clock: the deadline after the last point, not the stepped time
    assert fired[0].wall_time == pytest.approx(WALL0 + 99 + 15 * 60)


def feed_live(engine: Engine, silence: SilenceClock, batch: list[Point]) -> list[Transition]:
    """What the service does with a batch read from a file."""
    out: list[Transition] = []
    for run, rows in batches_of(batch):
        for part, step in silence.arrived(run, rows):
            if step:
                engine.shift_clock(run, step)
            out += engine.feed_rows(run, part)
    return out


@pytest.mark.parametrize("step", [3 * HOUR, -3 * HOUR])
@pytest.mark.parametrize("cut", [0, 3], ids=["between-batches", "mid-batch"])
def test_points_stamped_after_a_step_show_no_gap_and_no_slow_step(step: float, cut: int) -> None:
    """The job's stamps step with the node's clock; the pack's run_stalled and step_stalled
    (one interval of 10 minutes, x100 the pace) would both read the step as hours of silence."""
    clocks = Clocks()
    history = points("1x100", run="job")
    clocks.wall = clocks.mono = history[-1].wall_time
    engine = Engine(load_rules([]))  # the shipped pack
    silence = SilenceClock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    assert feed_live(engine, silence, history) == []
    later = points("1x6", run="job", start=100)
    clocks.wall += step
    shifted = [
        p._replace(wall_time=p.wall_time + (step if i >= cut else 0.0)) for i, p in enumerate(later)
    ]
    clocks.advance(6.0)
    assert feed_live(engine, silence, shifted) == []
    for _ in range(5):
        clocks.advance(1.0)
        more = [Point("job", "loss", shifted[-1].step + 1, clocks.wall, 1.0)]
        assert (
            feed_live(engine, silence, more) == []
            and engine.tick(silence.look(), silence.now_of) == []
        )
    if step > 0:  # without the cut, the same points are hours of silence
        plain = Engine(load_rules([]))
        plain.feed_all(history)
        assert "run_stalled" in {t.rule for t in plain.feed_all(shifted)}


def test_a_step_is_said_once_however_many_runs_it_touches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    clocks.wall = clocks.mono = WALL0 + 99
    engine, silence = live_runs(clocks, runs=50)
    with caplog.at_level(logging.WARNING, logger="trainsentry.runtime.silence_clock"):
        silence.look()
        clocks.wall -= 2 * HOUR
        for _ in range(5):
            clocks.advance(1.0)
            silence.look()
            for r in range(50):
                feed_live(engine, silence, [Point(f"run{r}", "loss", 200, clocks.wall, 1.0)])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("the wall clock stepped back by 7200 s")
    assert messages[1].startswith("timestamps of run run0 stepped back by 72")


def test_a_run_silent_before_the_daemon_started_keeps_its_real_gap() -> None:
    clocks = Clocks()
    old = points("1x100", run="job")  # its last point three hours before the daemon read it
    clocks.wall = clocks.mono = old[-1].wall_time + 3 * HOUR
    engine = Engine(RULES)
    silence = SilenceClock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    feed_live(engine, silence, old)
    clocks.advance(5.0)
    resumed = [Point("job", "loss", 100, clocks.wall, 1.0)]
    assert [(t.rule, t.state) for t in feed_live(engine, silence, resumed)] == [
        ("stalled", "firing"),
        ("stalled", "resolved"),
    ]


def general_path(clock: SilenceClock, run: str, rows: list[Row]) -> list[tuple[int, float]]:
    """What `arrived` did before its short paths: history aside, every distinct stamp judged."""
    wall, mono = clock._wall(), clock._mono()
    unstepped = clock._offset + mono
    if not _live(rows[0][1], wall, unstepped) and not _live(rows[-1][1], wall, unstepped):
        return [(len(part), shift) for part, shift in clock.arrived(run, rows)]
    return [(len(part), shift) for part, shift in clock._cut(run, rows, wall, mono)]


# offsets of a batch's stamps from the job's clock: spread by microseconds as a TensorBoard
# record's values are, by an evaluation's seconds, or a step apart; or no stamp at all
_OFFSETS = st.sampled_from([0.0, 1e-5, 3.0, 300.0, -300.0, 599.0, 700.0, -700.0, 5000.0, math.nan])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 2000),
            st.floats(-4000, 4000),
            st.booleans(),
            st.lists(_OFFSETS, min_size=1, max_size=5),
        ),
        max_size=30,
    )
)
def test_a_batch_is_cut_as_the_general_path_cuts_it(
    moves: list[tuple[float, float, bool, list[float]]],
) -> None:
    """`arrived` takes short paths for one row and for a batch whose stamps lie within a
    step of each other; the general path judges every stamp. Same cuts, same steps, same
    state, whatever the batches' stamps and the host's clock do."""
    clocks = Clocks()
    short = SilenceClock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    general = SilenceClock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    stamp = clocks.wall
    step = 0
    for elapsed, drift, stepped, offsets in moves:
        clocks.advance(elapsed)
        if stepped:
            clocks.wall += drift  # the host's clock stepped
        stamp += elapsed + (drift if not stepped else 0.0)  # the job's clock
        rows = []
        for offset in offsets:
            rows.append(Row(step, stamp + offset, ("loss",), (1.0,)))
            step += 1
        cut = [(len(part), shift) for part, shift in short.arrived("r", rows)]
        assert cut == general_path(general, "r", rows)
        assert short._runs == general._runs
