"""What a restart keeps, restores and relearns: the one module that decides it.

A restarted daemon resumes reading where it stopped (the offsets in state.db,
committed by the loop). That alone would come back with an empty engine:
windows and baselines start over, an alert that was firing is forgotten
(never repeated, never re-sent to Alertmanager, never resolved), and a rule
with a 200-step window is blind for 200 steps. So the alert state — the
engine, the firing book, each series' newest point — is saved now and then
(`Restart.save`) with the read position of every file at that moment, in a
file of its own beside state.db (`SnapshotFile`).

After a restart the state is restored (`AlertMemory.restore`) and each file
is read again from its snapshot position up to its committed offset
(`relearn_start`; FileTail's `relearn_from` reads those bytes), those points
going to `AlertMemory.relearn`: the engine arrives exactly where it was, and
their transitions only update the firing book (they were told before). Runs
whose files are no longer followed are resolved "no longer watched"
(`keep_only`).

Why a pickle of the live objects rather than a schema of their fields: the
state is that of ten condition kinds (rolling windows, fits, baselines, EWMAs)
and the lifecycles, all plain slotted dataclasses; a hand-written schema for
each would be a second copy of every one of them to keep in step. Pickling
1,000 runs × 20 series with full windows takes about 0.4 s and 17 MB, so it is
taken once a minute at most and at most SNAPSHOT_SHARE of the loop, not per
cycle. The file never leaves the state dir the daemon itself writes, so
unpickling it trusts nothing new.

A pickle is only as good as the code that reads it: objects of a class that
gained a field would load without it. So a snapshot is tagged with a digest
of the modules whose objects it holds, and one from other code is ignored —
the daemon then relearns from the logs, which costs a backfill's time once.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from trainsentry import __version__
from trainsentry.alert import Transition
from trainsentry.alerts.grouping import FiringBook
from trainsentry.point import CHECKPOINT_PREFIX, Point, Row
from trainsentry.rules.engine import Engine
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.model import RuleSet
from trainsentry.runtime import heap
from trainsentry.state.damage import set_aside
from trainsentry.state.db import Checkpoint
from trainsentry.store import Store
from trainsentry.store.limits import SeriesLimit
from trainsentry.store.ranks import RankBook

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "alert-state.snapshot"
SNAPSHOT_FORMAT = 1
# The code whose objects a snapshot holds: its digest tags the snapshot.
_PACKAGE = Path(__file__).resolve().parents[1]
_PICKLED_MODULES = ("runtime/restart.py", "alert.py", "point.py", "rules", "alerts/grouping.py")
# The alert state is saved this often, and at a clean stop; at most SNAPSHOT_SHARE
# of the loop's time goes to it. A fleet of 1,000 runs with full windows saves in
# ~0.4 s: once a minute that is 7 % of the daemon's CPU, so such a fleet saves
# about every 80 s (a restart relearns at most that much more), a small one still
# every minute.
SNAPSHOT_SECONDS = 60.0
SNAPSHOT_SHARE = 0.005


class UnreadableState(Exception):
    """A snapshot's alert state that cannot be read back: the file is set aside."""


class Memory(Protocol):
    """State kept downstream of the loop's sinks that a restart must not lose."""

    digest: str  # of the code that reads `dump`'s bytes back

    def restore(self, blob: bytes) -> bool:
        """Take a saved state back; False if it cannot be used (then all is relearned).
        UnreadableState, saying why, when the bytes cannot be read back (a damaged file)."""
        ...

    def dump(self, out: BinaryIO) -> None:
        """Write the state to `out` (the bytes `restore` takes back)."""
        ...

    def relearn(self, run: str, rows: list[Row]) -> None:
        """Rows delivered before the restart, read again to rebuild the state."""
        ...

    def keep_only(self, runs: set[str]) -> None:
        """After the first sweep: release the restored runs no file is followed for."""
        ...


# -- the file ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Saved alert state and the read position of each file it has seen."""

    blob: bytes
    offsets: dict[str, Checkpoint]


class SnapshotFile:
    """`alert-state.snapshot` in the state dir; with no directory, kept in memory (tests)."""

    def __init__(self, directory: Path | None) -> None:
        self.path = directory / SNAPSHOT_FILE if directory is not None else None
        self._in_memory: bytes | None = None

    def load(self, digest: str) -> Snapshot | None:
        """The saved alert state, if one was saved by code of this `digest`; None if it
        is missing, of other code, or damaged (then everything is relearned)."""
        try:
            if self.path is None:
                if self._in_memory is None:
                    return None
                source: BinaryIO = io.BytesIO(self._in_memory)
            else:
                source = open(self.path, "rb")  # noqa: SIM115  # closed below
        except FileNotFoundError:
            return None
        except OSError as exc:  # unreadable: relearned, as a damaged one is
            log.warning("cannot read the saved alert state: %s; relearning from the logs", exc)
            return None
        with source:
            try:
                form, saved_by, rows = pickle.load(source)
                if form != SNAPSHOT_FORMAT or saved_by != digest:
                    return None  # other code's: relearned, and overwritten at the next save
                offsets = {r[0]: Checkpoint(*r) for r in rows}
                blob = source.read()
            except Exception as exc:  # truncated or garbled: kept aside, said, relearned
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                return Snapshot(blob, offsets)
        self.set_aside(reason)
        return None

    def set_aside(self, reason: str) -> None:
        """A snapshot that cannot be read back: moved aside with the time (kept for a
        look, never read again) and said once, with what is lost."""
        if self.path is None:
            self._in_memory = None
            return
        try:
            kept = set_aside(self.path)
        except OSError as exc:  # the next save replaces it: nothing is read from it again
            log.warning(
                "%s is damaged (%s) and cannot be moved aside (%s); relearning from the logs",
                self.path,
                reason,
                exc.strerror or exc,
            )
            return
        log.warning(
            "%s is damaged (%s); moved aside to %s. Lost with it: the alert state (rule "
            "windows, pending and firing alerts, who was told); it is relearned from the "
            "logs, read again from their start, so an alert that fired before may be told "
            "again.",
            self.path,
            reason,
            kept,
        )

    def save(
        self, digest: str, dump: Callable[[BinaryIO], None], positions: Iterable[Checkpoint]
    ) -> int:
        """Replace the snapshot: `dump` writes the state, saved with the read positions
        it goes with in one file (written aside, then renamed over the old one, so
        one never outlives the other); its size.

        Not a blob in state.db: the state of 1,000 runs is ~17 MB, and copying it
        into SQLite's WAL (and from there into the database at the next
        checkpoint) took longer than pickling it (measured: 0.2-0.36 s against
        0.15 s), time the loop spent not reading. Not fsynced: after a power
        cut a lost snapshot means a relearn from the logs, the time of a backfill.
        """
        rows = [
            (c.path, c.dev, c.ino, c.fingerprint, c.offset, c.behind, c.decoder_state)
            for c in positions
        ]

        def write(out: BinaryIO) -> int:
            pickle.dump((SNAPSHOT_FORMAT, digest, rows), out, pickle.HIGHEST_PROTOCOL)
            dump(out)
            return out.tell()

        if self.path is None:
            buffer = io.BytesIO()
            size = write(buffer)
            self._in_memory = buffer.getvalue()
            return size
        aside = self.path.with_name(self.path.name + ".new")
        try:
            with open(aside, "wb") as out:
                size = write(out)
            os.replace(aside, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                aside.unlink()
            raise
        return size


# -- what the loop asks ----------------------------------------------------------


def relearn_start(saved: Checkpoint | None, committed: Checkpoint | None) -> Checkpoint | None:
    """Where to read a file again from so the restored state catches up; None: nothing to.

    The saved state saw the file up to its snapshot position (nothing of it,
    if the file is not in the snapshot, or the snapshot's file is another one
    at that path); what was read after that, up to the committed offset, is
    what it lacks.
    """
    if committed is None or committed.offset == 0:
        return None
    start = saved
    if start is None or not start.same_file(committed) or start.offset > committed.offset:
        start = Checkpoint(committed.path, 0, 0, b"", 0)
    return None if start.offset == committed.offset else start


@dataclass(slots=True)
class SaveStats:
    saves: int = 0  # alert-state snapshots written
    failures: int = 0
    saved_at: float | None = None  # time.time() of the last snapshot written
    seconds: float = 0.0  # how long the last one took
    bytes: int = 0  # its size


class Restart:
    """The loop's side: what was restored, from where each file relearns, when to save."""

    def __init__(
        self,
        memory: Memory,
        file: SnapshotFile,
        *,
        every: float = SNAPSHOT_SECONDS,
        on_error: Callable[[str], None] = lambda msg: log.warning("%s", msg),
    ) -> None:
        self.memory = memory
        self.file = file
        self.stats = SaveStats()
        self._every = every
        self._on_error = on_error
        self._next = time.monotonic() + every
        self._earliest = 0.0  # the share of the loop snapshots may take allows one
        saved = file.load(memory.digest)
        try:
            if saved is not None and not memory.restore(saved.blob):
                saved = None
        except UnreadableState as exc:
            file.set_aside(str(exc))
            saved = None
        # where the restored state stopped reading each file; empty: nothing restored
        self._positions = saved.offsets if saved is not None else {}

    def positions(self) -> dict[str, Checkpoint]:
        """Where the restored state stopped reading each file (empty: nothing restored)."""
        return dict(self._positions)

    def relearn_from(self, committed: Checkpoint | None) -> Checkpoint | None:
        """For a file being followed: where to relearn from (see relearn_start)."""
        if committed is None:
            return None
        return relearn_start(self._positions.pop(committed.path, None), committed)

    @property
    def due(self) -> bool:
        return time.monotonic() >= self._next

    def make_due(self) -> None:
        """Take the next snapshot at the next cycle's end (tests)."""
        self._next = 0.0

    def released(self) -> None:
        """Files were released: the snapshot still holds their positions, and a file
        recreated at the same path (a reused inode, the same first bytes) must not be
        relearned from them after a restart. So the next is taken as soon as the share
        allows, not at the interval (not at once: a cleanup deleting runs one by one
        must not pickle the fleet each time)."""
        self._next = min(self._next, self._earliest)

    def save(self, positions: Iterable[Checkpoint]) -> None:
        """Save the memory with these read positions; the interval stretches so that
        snapshots take at most SNAPSHOT_SHARE of the loop."""
        began = time.monotonic()
        try:
            size = self.file.save(self.memory.digest, self.memory.dump, positions)
        except Exception as exc:  # a full disk must not stop reading; the next try may work
            self.stats.failures += 1
            self._on_error(f"could not save the alert state: {exc}")
        else:
            self.stats.saves += 1
            self.stats.saved_at, self.stats.bytes = time.time(), size
        heap.trim()  # the pickler's memo, freed: see heap.py
        spent = self.stats.seconds = time.monotonic() - began
        self._earliest = time.monotonic() + spent / SNAPSHOT_SHARE
        self._next = max(time.monotonic() + self._every, self._earliest)


# -- what is saved: the alert state of `trainsentry run` -------------------------------


def code_digest() -> str:
    """A digest of the code whose objects a snapshot holds."""
    h = hashlib.sha256(__version__.encode())
    for name in _PICKLED_MODULES:
        path = _PACKAGE / name
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Saved:
    engine: Engine
    book: FiringBook
    # The newest point of every series: the evidence store itself is not saved
    # (too large), but without these a quiet run would show no step, no age and
    # no series after a restart while its alerts fire.
    lasts: list[Point]
    # pattern alerts and run lives (rules/log_rules.py): a crash stays a crash
    log_engine: LogEngine | None = None


def dump_state(
    engine: Engine,
    book: FiringBook,
    lasts: list[Point],
    out: BinaryIO,
    log_engine: LogEngine | None = None,
) -> None:
    """Pickled into a file, not into bytes: pickle.dumps grows its buffer by
    doubling and then copies it out, which at 1,000 runs × 20 series doubled
    the snapshot's passing peak (+70 MB over a 14 MB pickle, the rest is the
    pickler's memo); written to a file, the pickle streams in 64 KB frames.

    The cyclic collector is held off meanwhile: pickling allocates (and frees
    at once, by refcount) a state dict per object, which set off collections
    that walked the whole heap and doubled the pickle's time (measured: 0.55
    s with, 0.27 s without, at 1,000 runs x 20 series)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        saved = Saved(engine, book, lasts, log_engine)
        pickle.dump(saved, out, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        if collecting:
            gc.enable()


def load_state(blob: bytes) -> Saved:
    """The saved state; UnreadableState saying why it cannot be read back (a damaged blob
    must not stop the daemon: the snapshot is set aside and the state relearned)."""
    try:
        saved = pickle.loads(blob)
    except Exception as exc:
        raise UnreadableState(
            f"its alert state cannot be read back: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(saved, Saved):
        raise UnreadableState(f"it holds a {type(saved).__name__}, not an alert state")
    return saved


class Stages(Protocol):
    """The service's stages a restart saves and restores."""

    engine: Engine
    log_engine: LogEngine
    store: Store
    book: FiringBook
    ruleset: RuleSet
    series_limit: SeriesLimit
    ranks: RankBook

    def deliver(self, transitions: list[Transition]) -> None: ...

    def relearned_transitions(self, transitions: list[Transition]) -> None: ...


class AlertMemory:
    """`Memory` for `trainsentry run`: the engine, the firing book, each series' last point."""

    def __init__(self, stages: Stages, relearned_points: Callable[[], int]) -> None:
        self.digest = code_digest()
        self._stages = stages
        self._relearned_points = relearned_points
        self.restored: list[Transition] | None = None  # what a rule change resolved

    def restore(self, blob: bytes) -> bool:
        loaded = load_state(blob)
        s = self._stages
        s.engine, s.book = loaded.engine, loaded.book
        s.store.extend(loaded.lasts)
        self.restored = s.engine.reload(s.ruleset)  # rules edited while it was down
        if loaded.log_engine is not None:
            s.log_engine = loaded.log_engine
            self.restored += s.log_engine.reload(s.ruleset)
        return True

    def dump(self, out: BinaryIO) -> None:
        store = self._stages.store
        lasts = [s.last for run in store.runs() for s in store.series(run).values()]
        s = self._stages
        dump_state(s.engine, s.book, lasts, out, s.log_engine)

    def relearn(self, run: str, rows: list[Row]) -> None:
        s = self._stages
        rows = s.series_limit.admit(run, rows)
        s.store.extend_rows(run, rows)
        if not (rows and rows[0].tags and rows[0].tags[0].startswith(CHECKPOINT_PREFIX)):
            s.ranks.rows(run, rows)  # a rank's pace and values, shown only: not saved
        s.relearned_transitions(s.log_engine.stepped(run, rows))
        s.relearned_transitions(s.engine.feed_rows(run, rows))

    def keep_only(self, runs: set[str]) -> None:
        s = self._stages
        for run in set(s.engine.runs()) - runs:
            s.deliver(s.engine.finish(run, "no longer watched"))
        for run in set(s.log_engine.lives()) - runs:
            s.deliver(s.log_engine.finish(run, "no longer watched"))
        if self.restored is not None:  # counted now: the snapshot may predate a resolve
            print(
                f"trainsentry: restored the alert state ({len(s.book)} firing now, "
                f"{self._relearned_points()} points relearned)",
                file=sys.stdout,
                flush=True,
            )
