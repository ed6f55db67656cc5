"""Live no-data and pace checks across wall-clock steps: a step is neither silence nor a hang.

`Engine.tick(now)` fires run_stalled when `now` passes a run's last wall stamp
plus its allowed silence, and a later point whose stamp is far past the last
one reveals a gap. A wall clock stepped by hours (NTP correcting a drifted
node, a VM resumed, `date -s`) fools both: with `now = time.time()` every live
run looks hours silent at once, a storm of false "data stopped" alerts; and
the next points, stamped by the jobs' stepped clock, show a gap of hours that
never happened (run_stalled, and step_stalled's "one step took hours").

The monotonic clock does not step, so this module measures with it:

- `now_of(run)` is the wall time when the run's newest points arrived plus
  the monotonic time since: without a step it equals time.time() (to the
  clock's slew), with one it is still the silence the run really kept;
- `arrived(run, rows)` compares each live record's stamp with the run's
  previous one: a jump that the monotonic time since cannot explain (by more than
  STEP_SECONDS) is a step, and the batch is cut there so the engine's clocks
  for that run can be moved by the step (Engine.shift_clock) before the rest.

Points far from the daemon's own clock (a backfill of old runs, a job on a
host whose clock disagrees) are not judged: their gaps are the data's own.
The data's stamps are never changed; alerts keep the data's time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from operator import itemgetter

from trainsentry.point import Row

log = logging.getLogger(__name__)

# Jumps beyond what real time explains by more than this are steps. Writers
# buffer points up to 2 minutes (flush_secs=120), and a run's files (train/,
# validation/) are read one after the other, so their stamps interleave by
# about as much; ten minutes is well clear, and below every silence floor.
STEP_SECONDS = 600.0
SAY_EVERY_SECONDS = 60.0
_STAMP = itemgetter(1)  # a Row's wall time


def _live(stamp: float, wall: float, unstepped: float) -> bool:
    """Near this host's clock, before or after a step (not history, not another clock)."""
    return abs(wall - stamp) < STEP_SECONDS or abs(unstepped - stamp) < STEP_SECONDS


class SilenceClock:
    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._mono = mono
        # run -> [last stamp, arrival wall, arrival monotonic, 1.0 if the stamp was live]
        self._runs: dict[str, list[float]] = {}
        self._offset = wall() - mono()
        self._said_at = -math.inf
        self._unsaid = 0

    def arrived(self, run: str, rows: Sequence[Row]) -> list[tuple[Sequence[Row], float]]:
        """A file's rows in order, cut where the run's stamps stepped: (rows, step before them)."""
        wall, mono = self._wall(), self._mono()
        unstepped = self._offset + mono  # the wall clock as it was before a step not yet looked at
        first, last = rows[0][1], rows[-1][1]
        if not _live(first, wall, unstepped) and not _live(last, wall, unstepped):
            # history (a backfill): nothing to judge, and no per-row cost
            self._runs[run] = [last, wall, mono, 0.0]
            return [(rows, 0.0)]
        if len(rows) == 1:  # a live record (its stamp is live: it passed the test above)
            jump = self._observe(run, first, True, wall, mono)
            return [((), jump), (rows, 0.0)] if jump else [(rows, 0.0)]
        stamps = list(map(_STAMP, rows))
        if not (math.isfinite(sum(stamps)) and max(stamps) - min(stamps) <= STEP_SECONDS):
            return self._cut(run, rows, wall, mono)
        # No two stamps of the batch are a step apart, so only its first can reveal
        # one, against the run's last: a TensorBoard record's 20 values have 20
        # stamps, and judging each was most of this module's cost.
        jump = self._observe(run, first, _live(first, wall, unstepped), wall, mono)
        seen = self._runs[run]
        seen[0], seen[3] = last, float(_live(last, wall, unstepped))
        return [((), jump), (rows, 0.0)] if jump else [(rows, 0.0)]

    def _cut(
        self, run: str, rows: Sequence[Row], wall: float, mono: float
    ) -> list[tuple[Sequence[Row], float]]:
        """`arrived`'s general path: every distinct stamp judged against the one before."""
        unstepped = self._offset + mono
        parts: list[tuple[Sequence[Row], float]] = []
        start = 0
        previous = math.nan
        for i, row in enumerate(rows):
            stamp = row[1]
            if stamp != stamp or stamp == previous:
                continue  # no stamp to judge (NaN), or judged already
            previous = stamp
            jump = self._observe(run, stamp, _live(stamp, wall, unstepped), wall, mono)
            if jump:
                parts.append((rows[start:i], 0.0))
                parts.append(((), jump))
                start = i
        if not parts:
            return [(rows, 0.0)]
        parts.append((rows[start:], 0.0))
        return [p for p in parts if p[0] or p[1]]

    def _observe(self, run: str, stamp: float, now_live: bool, wall: float, mono: float) -> float:
        """Note a record's stamp; the step it reveals (0.0: none)."""
        seen = self._runs.get(run)
        if seen is None:
            self._runs[run] = [stamp, wall, mono, float(now_live)]
            return 0.0
        jump = 0.0
        # both stamps live when they arrived: a run that was silent before the
        # daemon started had a real gap, not a step
        if now_live and seen[3]:
            elapsed = mono - seen[2]
            gap = stamp - seen[0] - elapsed
            if gap > STEP_SECONDS or stamp - seen[0] < -STEP_SECONDS:
                jump = gap
                self._say(run, jump, elapsed)
        seen[0], seen[1], seen[2], seen[3] = stamp, wall, mono, float(now_live)
        return jump

    def now_of(self, run: str) -> float:
        """The wall time a run's silence is measured to, as if the clock had not stepped."""
        seen = self._runs.get(run)
        if seen is None:
            return self._wall()
        return seen[1] + (self._mono() - seen[2])

    def look(self) -> float:
        """Once a cycle: say when the daemon's own wall clock stepped; the wall time now."""
        wall, mono = self._wall(), self._mono()
        step = (wall - mono) - self._offset
        if abs(step) > STEP_SECONDS / 100:
            log.warning(
                "the wall clock stepped %s by %.0f s; the silence of runs is measured on the "
                "monotonic clock, so no run looks stalled because of it",
                "forward" if step > 0 else "back",
                abs(step),
            )
        self._offset = wall - mono
        return wall

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)

    def _say(self, run: str, jump: float, elapsed: float) -> None:
        mono = self._mono()
        if mono - self._said_at < SAY_EVERY_SECONDS:
            self._unsaid += 1
            return
        others = f" (and {self._unsaid} more since)" if self._unsaid else ""
        log.warning(
            "timestamps of run %s stepped %s by %.0f s while %.0f s passed: a clock step, "
            "not counted as silence or as a slow step%s",
            run,
            "forward" if jump > 0 else "back",
            abs(jump),
            elapsed,
            others,
        )
        self._said_at, self._unsaid = mono, 0
