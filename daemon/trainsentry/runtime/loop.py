"""The live daemon's loop: the one place where watcher, tailers, state and sinks meet.

Each cycle reads only the files the watcher reported (or all of them on a
sweep), hands the new points to the sinks, and only then commits the read
offsets in one transaction. A crash between the two re-reads at most one
cycle's points; a clean stop (SIGTERM) loses and repeats nothing.

Sweeps also count the directories they walk: inotify needs one watch per
directory, and when the kernel's limit is used up watchdog leaves part of
the tree unwatched without a word. Directories against watches is how the
daemon notices, and a root short of watches is polled from then on.

What the consumer of the points remembers (the alert state) is saved now
and then with the read position of every file, and after a restart each file
is read again from that position up to its committed offset, those points
going to `Memory.relearn` instead of the sinks: restart.py decides what and
from where; the loop only asks it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

from trainsentry.jobs.identity import rank_refused
from trainsentry.point import ProbeMark, Row, RunEnd, TextEvent, Trace
from trainsentry.runtime.restart import SNAPSHOT_SECONDS, Memory, Restart, SnapshotFile
from trainsentry.runtime.run_merge import RunMerge
from trainsentry.sources.access import AccessProblems
from trainsentry.sources.checkpoints import CheckpointTail
from trainsentry.sources.discover import LogFile, is_log, roots, run_directory, store_of
from trainsentry.sources.following import Tail, follow
from trainsentry.sources.names import safe_name
from trainsentry.sources.survey import NO_FILES, nothing_readable
from trainsentry.sources.tail import READ_BUDGET, FileTail
from trainsentry.state.db import Checkpoint, StateDB
from trainsentry.terminal.progress import Backfill
from trainsentry.watching import new_watcher
from trainsentry.watching.kernel import (
    inotify_watch_limit,
    inotify_watches,
    limit_advice,
    watch_shortfall,
)

log = logging.getLogger(__name__)

# A file's new rows, with their run: what the sinks are handed per file read.
RowSink = Callable[[str, list[Row]], None]
# A text log's new events, with their run (sources/textlog.py).
EventSink = Callable[[str, list[TextEvent]], None]
# What trackers said of their runs besides points: traces, and that runs ended.
ReportSink = Callable[[list[tuple[str, Trace]], list[RunEnd]], None]
# The probe's meta and end records of a file, with their run (sources/probe_marks.py).
MarkSink = Callable[[str, list[ProbeMark]], None]
_VALUES = itemgetter(3)  # a Row's values
# what is said of a tracker's store that is none (mlflow_db.NotAStore): no permission to fix
_NO_STORE = "not read as an MLflow store; read again at its next change"

# Even with inotify, sweep now and then: events can be lost (queue overflow,
# watch limit reached, a directory created between listing and watching).
SAFETY_SWEEP_SECONDS = 30.0
DEFAULT_POLL_SECONDS = 2.0
SIGNAL_CHECK_SECONDS = 0.25
# Logs whose rows are not merged with their run's other files (run_merge.py): a
# checkpoint root's rows are saves (judged apart, runtime/service.py), a text log's are
# its ranks', a tracker's database holds many runs.
_UNGATHERED = frozenset({"checkpoints", "text", "mlflow_db"})
# Files that say how a run ended and hold none of its rows (an MLflow file-store run's
# meta.yaml): read after the cycle's other files, so the rows its end comes after are in.
_ENDS_ONLY = frozenset({"mlflow_run"})
# watchdog adds watches for new directories on its own thread: a sweep may see
# a directory a moment before its watch exists. A shortfall must outlast this
# grace before the root is declared deaf and polled.
WATCH_GRACE_SECONDS = 1.0
# Read offsets are committed at most this often (and before every snapshot, at a
# stop, and at the end of a cycle that showed alert transitions), not after every
# cycle: a SQLite transaction per cycle was a tenth of the daemon's CPU, and a
# commit writes a row per file read since the last one, ~3 µs each: a fleet of a
# thousand live files costs ~6 ms a commit (once a second, 4 % of the daemon's
# CPU). A kill -9 then repeats at most this long of points on the terminal (-vv);
# the outbox's idempotency keys keep every notification from being sent twice.
COMMIT_SECONDS = 2.0
# Runs one daemon follows at most: each costs the rules' windows (~25 kB once full) and
# the store's series (~110 kB for 20 of them), so 10,000 runs are ~1.5 GB; a larger
# root is split between daemons with --shard. A run beyond it is said once, counted.
MAX_RUNS = 10_000
# A text log's event that the next line may still continue (an exception a chained one
# may follow) is held until its log has been quiet this long, then let go as it is: a
# crashing Python writes its whole chain in one burst of milliseconds, and a second
# keeps a crash's page within a second or two of its last line.
HOLD_SECONDS = 1.0
# A due snapshot waits this long at most for held rows to be let go (`_settled`): runs
# whose files are written out of step without pause would otherwise never allow one.
SNAPSHOT_WAIT_SECONDS = 10.0
# A cycle begins at most this long after the one before: the files changed meanwhile are
# read in one cycle. A live fleet writes a file every millisecond or so, and every cycle
# has a cost of its own (the event read, the per-cycle checks, the heartbeat); a tenth
# of a second of lag is nothing beside seconds of rules' patience.
BATCH_SECONDS = 0.1


@dataclass(slots=True)
class Stats:
    points: int = 0
    relearned: int = 0  # points read again after a restart to rebuild the alert state
    runs_refused: int = 0  # runs found beyond MAX_RUNS, not followed
    skipped_records: int = 0
    files: int = 0
    cycles: int = 0
    directories: int | None = None  # walked by the last sweep; None before the first


class Daemon:
    def __init__(
        self,
        paths: Sequence[Path],
        state: StateDB,
        sinks: Sequence[RowSink],
        *,
        poll: float | None = None,
        on_error: Callable[[str], None] | None = None,
        on_release: Callable[[str], object] | None = None,
        on_cycle: Callable[[], object] | None = None,
        owns_run: Callable[[str], bool] | None = None,
        max_wait: float | None = None,
        memory: Memory | None = None,
        snapshot_every: float = SNAPSHOT_SECONDS,
        on_events: EventSink | None = None,
        on_report: ReportSink | None = None,
        on_marks: MarkSink | None = None,
        on_follow: Callable[[str], object] | None = None,
    ) -> None:
        """`memory`: the alert state a restart restores and relearns (restart.py);
        `on_events`: where text logs' events go (none: they are dropped); `on_report`:
        where runs' traces and ends go; `on_marks`: where the probe's meta and end
        records go (none: dropped); `on_follow`: told each run a newly followed file is of,
        before any file of a sweep is read (the ranks of a job wait for one another)."""
        self.roots = roots(paths, replay=False)
        self.state = state
        self.sinks = list(sinks)
        self.poll = poll
        self.stats = Stats()
        self._on_error = on_error or (lambda msg: log.warning("%s", msg))
        self._on_release = on_release
        self._on_cycle = on_cycle
        self._on_events = on_events
        self._on_report = on_report
        self._on_marks = on_marks
        self._on_follow = on_follow
        self._owns_run = owns_run  # --shard: the runs this daemon is responsible for
        self.max_wait = max_wait  # the loop turns at least this often (heartbeats)
        self.on_progress: Callable[[], object] | None = None  # called after each file read
        # Called after each file read until the startup backlog is read, then once with done=True.
        self.on_backfill: Callable[[Backfill], object] | None = None
        self._backfill_start: float | None = None
        self._backfill_points = 0
        self._caught_up: set[str] = set()
        self._dirs_by_root: dict[Path, int] = {}
        self._tails: dict[str, Tail] = {}
        self.nothing_readable: tuple[str, ...] = ()  # a line per root with no log read
        self.access = AccessProblems()  # unreadable paths, said once each
        self._refused: set[str] = set()  # files named like logs that are none, said once
        self._busy: set[str] = set()  # logs a writer holds locked, said once each
        self._files_of: dict[str, int] = {}  # run → files followed of it
        self._store_runs: set[str] = set()  # the runs taken from stores of many (mlflow.db)
        self._runs_refused: set[str] = set()  # beyond MAX_RUNS
        self._checkpoints = state.load_offsets()
        self.restart = (
            None
            if memory is None
            else Restart(
                memory,
                SnapshotFile(state.directory),
                every=snapshot_every,
                on_error=self._on_error,
            )
        )
        if not self._checkpoints and self.restart is not None:
            # state.db lost (moved aside as damaged, deleted) beside a good snapshot: its
            # positions are where the restored state stopped reading, so reading resumes
            # there; from the files' start, the restored rules would see every step again
            self._checkpoints = self.restart.positions()
        self._watcher = new_watcher()
        self._pending: set[str] = set()
        # Files whose path may name another file than the one open (a directory event
        # named it or a directory above it; every file at a sweep): read after a stat
        # of the path. The others are read through their handle alone (FileTail.read).
        self._relinked: set[str] = set()
        self._relearners: set[str] = set()  # files made to relearn; some may be done
        self._unsaved: dict[str, Tail] = {}  # read since the last commit
        self._holding: dict[str, float] = {}  # text logs holding an event → when to let go
        self._due: dict[str, float] = {}  # logs to read again at a time, changed or not
        self._merge = RunMerge()  # rows of a run's files, held until its other files catch up
        self._ending: set[str] = set()  # runs whose process is gone: all they wrote is read
        self._snapshot_waits: float | None = None  # since when a due snapshot waits on held rows
        self._next_commit = 0.0
        self._last_sweep = 0.0
        self._cycle_began = 0.0
        # Plain flags, not Events: a signal handler runs on the main thread between
        # bytecodes, possibly while that thread holds an Event's internal lock
        # (inside wait/clear); Event.set() from the handler would then deadlock.
        self.stopping = False
        self._woken = False

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._backfill_start = time.monotonic()
        if self.poll is None:
            self._watcher.watch([r.top for r in self.roots])
        self.sweep()
        if self.restart is not None:  # runs deleted, or no longer watched, while it was down
            self.restart.memory.keep_only({r for t in self._tails.values() for r in t.runs})

    def run_forever(self) -> None:
        self.start()
        try:
            while not self.stopping:
                self.cycle(timeout=self.max_wait)
        finally:
            self.close()

    def close(self) -> None:
        if self._backfill_start is not None:  # stopped mid-backfill: say so, not "caught up"
            self._backfilled(None, 0, more=False, stopped=True)
        self._watcher.stop()
        self._flush()  # the rows held are judged before the positions past them are saved
        self._save()
        self._snapshot()
        for tail in self._tails.values():
            tail.close()
        self.state.close()

    # -- one cycle ----------------------------------------------------------

    def stop(self) -> None:
        """Safe from a signal handler (sets a flag only): the loop ends after its cycle."""
        self.stopping = True

    def wake(self) -> None:
        """Safe from a signal handler (sets a flag only): end the current wait early."""
        self._woken = True

    def _wait(self, seconds: float) -> None:
        """Wait for file events, a stop or a wake, at most `seconds`.

        The signal flags are looked at every quarter second: the price of
        never taking a lock in a signal handler.
        """
        deadline = time.monotonic() + seconds
        while not (self.stopping or self._woken):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._watcher.wait(min(remaining, SIGNAL_CHECK_SECONDS)):
                break
        self._woken = False

    def sweep_interval(self) -> float:
        """Seconds between sweeps: the poll interval as soon as any root is polled."""
        if self.poll is not None:
            return self.poll
        if len(self._watcher.native) < len(self.roots) or self.access.directories:
            # network filesystem, unwatchable, short of watches, or an unreadable directory
            return DEFAULT_POLL_SECONDS
        return SAFETY_SWEEP_SECONDS

    def cycle(self, timeout: float | None = None) -> int:
        """Wait for changes (or the sweep timer), read them, deliver, commit."""
        interval = self.sweep_interval()
        if not self._pending:
            wait = max(0.0, self._last_sweep + interval - time.monotonic())
            if timeout is not None:
                wait = min(wait, timeout)
            if self._unsaved:  # a quiet moment must not leave offsets uncommitted
                wait = min(wait, max(0.0, self._next_commit - time.monotonic()))
            if self._holding:  # a held event is let go after a quiet moment
                wait = min(wait, max(0.0, min(self._holding.values()) - time.monotonic()))
            if self._due:  # a checkpoint that is settling is looked at again
                wait = min(wait, max(0.0, min(self._due.values()) - time.monotonic()))
            if self._merge.holding and (due := self._merge.due(time.monotonic())) is not None:
                wait = min(wait, max(0.0, due - time.monotonic()))  # held rows' wait ends
            self._wait(wait)
            gap = self._cycle_began + BATCH_SECONDS - time.monotonic()
            if gap > 0 and not self.stopping:
                time.sleep(gap)  # let what else changes meanwhile join this cycle
        if self.stopping:
            return 0
        self._cycle_began = time.monotonic()
        if time.monotonic() - self._last_sweep >= interval:
            return self.sweep()
        changes = self._watcher.take()
        if changes.overflow:  # the kernel dropped events: which files changed is unknown
            log.info("inotify queue overflowed: reading every file")
            return self.sweep()
        for path in changes.relinked:
            if path in self._tails:
                self._relinked.add(path)
            else:  # a directory moved or gone (rare): the paths of every file below it
                below = path + os.sep
                self._relinked.update(k for k in self._tails if k.startswith(below))
        for d in changes.dirs:
            self._discover(Path(d))
            # a checkpoint folder made or moved into a root followed already (Orbax and
            # staged saves rename theirs into place): its root looks again
            if (root := store_of(os.path.join(d, ""))) is not None and root in self._tails:
                self._pending.add(root)
        for f in changes.files:
            if f in self._tails:
                self._pending.add(f)
            elif (db := store_of(f)) is not None and db in self._tails:
                self._pending.add(db)  # a SQLite store changes through its journal or WAL
            elif is_log(f) and os.path.isfile(f):
                self._discover(Path(f))
        if self._due:
            now = time.monotonic()
            for key, due in list(self._due.items()):
                if due <= now:
                    del self._due[key]
                    self._pending.add(key)
        return self._read(self._pending)

    def sweep(self) -> int:
        self._last_sweep = time.monotonic()
        for root in self.roots:
            self._dirs_by_root[root.top] = self._discover(root.top)
        self.stats.directories = sum(self._dirs_by_root.values())
        self._check_watches()
        self._relinked = set(self._tails)  # a sweep looks at every path
        delivered = self._read(set(self._tails))
        self._survey()
        return delivered

    def unreadable(self) -> tuple[tuple[str, str, str], ...]:
        """Each path that cannot be read now: (path, its run, "" for a directory; why)."""
        found = []
        for path, why in sorted(self.access.failing.items()):
            tail = self._tails.get(path)
            found.append((path, tail.log.run if tail is not None else "", why))
        return tuple(found)

    def _survey(self) -> None:
        """Name each root that holds no log read (survey.py), said when that changes."""
        said = set(self.nothing_readable)
        now: list[str] = []
        for root in self.roots:
            top = str(root.top)
            mine = [t for k, t in self._tails.items() if k == top or k.startswith(top + os.sep)]
            if any(getattr(t, "not_a_store", None) is None for t in mine):
                continue
            now.append(nothing_readable(root.top, [t.log for t in mine]))
        for line in now:
            if line not in said:  # an empty root is said, not warned of: its jobs may not be up
                log.log(logging.INFO if line.endswith(NO_FILES) else logging.WARNING, "%s", line)
        self.nothing_readable = tuple(now)

    def _check_watches(self) -> None:
        """Poll the native roots when the kernel holds fewer watches than they have directories.

        The watches are counted for the whole process and the roots share one
        inotify descriptor, so a shortfall cannot be pinned on one root: every
        native root falls back, which costs a sweep every few seconds, never a
        missed point.
        """
        native = list(self._watcher.native)
        if not native:
            return
        directories = sum(self._dirs_by_root.get(r, 0) for r in native)
        deadline = time.monotonic() + WATCH_GRACE_SECONDS
        while True:
            # the walk may have met directories whose watches wait in unread events
            self._watcher.catch_up()
            watches = inotify_watches()
            short = watch_shortfall(directories, watches)
            if not short or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if not short:
            return
        limit = inotify_watch_limit()
        for root in native:
            self._watcher.fall_back(root)
        log.warning(
            "inotify watch limit reached: %d directories under %s but only %s watches held "
            "(fs.inotify.max_user_watches=%s, shared by all processes of this user); "
            "watchdog leaves the other %d directories unwatched without a word, so they are "
            "polled every %g s instead; %s",
            directories,
            ", ".join(map(str, native)),
            watches,
            limit if limit is not None else "unknown",
            short,
            self.sweep_interval(),
            limit_advice(limit, directories),
        )

    def _discover(self, top: Path) -> int:
        """Follow the log files under `top` not followed yet; the directories walked.

        Root.walk counts the directories in the same walk that finds the files:
        a second walk of a huge tree would double the cost of every sweep.
        """
        walked = 0
        followed = False
        for root in self.roots:
            if top != root.top and root.top not in top.parents:
                continue
            if not top.exists():
                continue
            errors: list[OSError] = []
            refused: list[tuple[str, str]] = []
            found_files, dirs = root.walk(top, errors, self._tails, refused)
            if self.access.walked(str(top), errors):
                self._watcher.rewatch(root.top)
            for path, why in refused:  # said once a path: sweeps come every 30 s
                if path not in self._refused:
                    self._refused.add(path)
                    log.warning("%s: %s", safe_name(path), why)
            walked += dirs
            for found in found_files:
                key = str(found.path)
                if key not in self._refused and (claim := rank_refused(found.path.name)):
                    self._refused.add(key)  # said once a path, as refusals are
                    log.warning("%s: %s", safe_name(key), claim)
                if found.kind != "mlflow_db" and not self._owned(found.run):
                    continue  # a store of many runs is read by every shard, for its own
                if key not in self._tails and self._room_for(found.run):
                    self._tails[key] = self._follow(found)
                    self._files_of[found.run] = self._files_of.get(found.run, 0) + 1
                    self._pending.add(key)
                    if self._on_follow is not None:
                        self._on_follow(found.run)
                    log.info("following %s (run %s)", key, found.run)
                    followed = True
        if followed and self.nothing_readable:  # a root said to hold nothing may hold these
            self._survey()  # once for the walk: each survey walks the empty roots again
        return walked

    def _owned(self, run: str) -> bool:
        return self._owns_run is None or self._owns_run(run)

    def _store_run(self, run: str) -> bool:
        """Whether rows of `run`, one of a store's runs (an mlflow.db holds many), are
        taken: this shard owns it and there is room for it, as for a file's run."""
        if run in self._store_runs:
            return True
        if not self._owned(run) or not self._room_for(run):
            return False
        self._store_runs.add(run)
        return True

    def _room_for(self, run: str) -> bool:
        """Whether a file of `run` may be followed: its run is, or there is room for it."""
        if run in self._files_of or len(self._files_of) + len(self._store_runs) < MAX_RUNS:
            return True
        if run not in self._runs_refused:
            self._runs_refused.add(run)
            self.stats.runs_refused += 1
            if len(self._runs_refused) == 1:
                log.warning(
                    "following %d runs already, the most one daemon follows: run %s and any "
                    "further new run are not read (split the root with --shard I/N)",
                    MAX_RUNS,
                    safe_name(run),
                )
        return False

    def _follow(self, found: LogFile) -> Tail:
        """A tail resuming where the last process stopped, relearning what the state lacks."""
        key = str(found.path)
        committed = self._checkpoints.pop(key, None)
        start = self.restart.relearn_from(committed) if self.restart is not None else None
        if start is None:
            return follow(found, committed)
        self._relearners.add(key)
        return follow(found, committed, relearn_from=start)

    def _read(self, keys: set[str]) -> int:
        """Read each file, hand its points on at once, then commit all offsets.

        Points go to the sinks file by file (not once per cycle) so a backfill
        of many large files never holds them all in memory, and `on_progress`
        can tell a heartbeat that a long cycle is working, not stuck. Only the
        rows of a run with several files may wait, for its other files to reach
        their step (run_merge.py), so that they are judged as replay judges them.
        """
        delivered = 0
        gone: list[str] = []
        again: set[str] = set()
        # Files still relearning first: the restored state catches up on every file
        # before new points of any run are judged, as they were seen live.
        if self._relearners:
            self._relearners = {k for k in self._relearners if self._relearning(k)}
        if self._relearners:
            order = sorted(keys, key=lambda k: (k not in self._relearners, k))
        else:  # nothing relearns (after the first minutes): no key function per file
            order = sorted(keys)
        # `meta.yaml` sorts before its run's `metrics/`: a status read first ended the run
        # before the last rows of the same moment were judged, and they never were
        last = [
            k for k in order if (t := self._tails.get(k)) is not None and t.log.kind in _ENDS_ONLY
        ]
        if last:
            told = set(last)
            order = [k for k in order if k not in told] + last
        for i, key in enumerate(order):
            if self.stopping:  # Ctrl-C in a long backfill: stop now, the rest stays unread
                again.update(order[i:])
                break
            tail = self._tails.get(key)
            if tail is None:
                continue
            relinked = key in self._relinked
            run = tail.log.run
            merged = tail.log.kind not in _UNGATHERED and self._files_of.get(run, 1) > 1
            before = tail.position() if merged and not tail.relearning else None
            got = tail.read(READ_BUDGET, same_file=not relinked)
            if relinked:
                self._relinked.discard(key)
            if got.unreadable:
                store = getattr(tail, "not_a_store", None) is not None
                self.access.failed(key, got.unreadable, _NO_STORE if store else None)
            else:
                self.access.readable(key)
            if got.busy and key not in self._busy:  # said once until it is read again
                self._busy.add(key)
                self._on_error(f"{safe_name(key)}: {got.busy}: read again at its next change")
            elif not got.busy and self._busy:
                self._busy.discard(key)
            if got.replayed_rows and self.restart is not None:
                self.stats.relearned += sum(map(len, map(_VALUES, got.replayed_rows)))
                self.restart.memory.relearn(got.run, got.replayed_rows)
            for err in got.errors:
                self.stats.skipped_records += 1
                self._on_error(err)
            for note in got.notes:  # a bound reached: said, nothing skipped
                self._on_error(note)
            if got.again_in is not None:
                self._due[key] = time.monotonic() + got.again_in
            elif self._due:
                self._due.pop(key, None)
            points = 0
            if got.others:  # a store's runs: each is a run for --shard and the run limit
                got.others = [(r, rows) for r, rows in got.others if self._store_run(r)]
            own: list[Row] = []
            if got.rows or got.others:
                batches = got.batches()
                points = sum(len(r[3]) for _, rows in batches for r in rows)
                log.info("read %d points from %s", points, key)
                delivered += points
                self.stats.points += points
                for of, rows in batches:
                    if merged and of == run:
                        own.extend(rows)
                    else:
                        self._hand_on(of, rows)
            if merged:
                now = time.monotonic()
                self._hand_on(run, self._merge.add(run, key, own, now=now, more=got.more,
                                                   before=before))  # fmt: skip
            if got.marks:  # the probe's records of its run's end come after its rows
                self._flush(run)
            for end in got.ends:  # a tracker's final status: the run's rows come before it
                self._flush(end.run)
            if got.events and self._on_events is not None:
                self._on_events(got.run, got.events)
            if (got.traces or got.ends) and self._on_report is not None:
                traces, ends = got.traces, got.ends
                if tail.log.kind == "mlflow_db":  # a run's params come before its metrics
                    traces = [t for t in traces if self._owned(t[0])]
                    ends = [e for e in ends if e.run in self._store_runs]
                self._on_report(traces, ends)
            if tail.log.kind == "text" and isinstance(tail, FileTail):
                if tail.holding:  # quiet from this read on, it is let go (text_events.py)
                    self._holding[key] = time.monotonic() + HOLD_SECONDS
                else:
                    self._holding.pop(key, None)
            if got.marks and self._on_marks is not None:
                self._on_marks(got.run, got.marks)
            if got.more:
                again.add(key)
            if got.gone:
                gone.append(key)
            else:
                self._unsaved[key] = tail
            if self.on_progress is not None:
                self.on_progress()
            if self._backfill_start is not None:
                self._backfilled(key, points, more=got.more)
        for run in self._ending:  # its process is gone: what it wrote is all read now
            self._flush(run)
        self._ending.clear()
        for run, rows in self._merge.release(time.monotonic()) if self._merge.holding else ():
            self._hand_on(run, rows)
        self._pending = again
        if self._holding:
            self._let_go()
        if time.monotonic() >= self._next_commit:
            self._commit()
        if gone:
            self._release(gone)
        self.stats.cycles += 1
        self.stats.files = len(self._tails)
        if self._backfill_start is not None and not again:
            self._backfilled(None, 0, more=False)
        if self._on_cycle is not None:
            self._on_cycle()
        if self.restart is not None and self.restart.due and self._settled():
            self._snapshot()
        return delivered

    def _hand_on(self, run: str, rows: list[Row]) -> None:
        if not rows:
            return
        for sink in self.sinks:
            sink(run, rows)

    def _flush(self, run: str | None = None) -> None:
        """Hand on the rows held of `run` (of every run): nothing more will join them."""
        for of, rows in self._merge.flush(run):
            self._hand_on(of, rows)

    def _settled(self) -> bool:
        """Whether a snapshot may be taken now: the memory it saves must have seen every
        row before the read positions it saves, so it waits while rows are held, at most
        SNAPSHOT_WAIT_SECONDS (runs whose files never all stop at once), then lets them go."""
        if not self._merge.holding:
            self._snapshot_waits = None
            return True
        now = time.monotonic()
        if self._snapshot_waits is None:
            self._snapshot_waits = now
        if now - self._snapshot_waits < SNAPSHOT_WAIT_SECONDS:
            return False
        self._flush()
        self._snapshot_waits = None
        return True

    def _checkpoint(self, key: str, tail: Tail) -> Checkpoint:
        """Where reading of `key` is committed: before its first row still held."""
        if not tail.relearning and (safe := self._merge.safe(key, tail.log.run)) is not None:
            return safe
        return tail.checkpoint()

    def _let_go(self) -> None:
        """Hand on the held events of text logs quiet for HOLD_SECONDS: a crash's last
        traceback, which no line will follow."""
        now = time.monotonic()
        for key, due in list(self._holding.items()):
            if due > now:
                continue
            del self._holding[key]
            tail = self._tails.get(key)
            if not isinstance(tail, FileTail):
                continue
            events = tail.let_go()
            self._unsaved[key] = tail  # its decoder no longer holds the lines
            if events and self._on_events is not None:
                self._on_events(tail.log.run, events)

    def _relearning(self, key: str) -> bool:
        tail = self._tails.get(key)
        return tail is not None and tail.relearning

    def _backfilled(
        self, key: str | None, points: int, *, more: bool, stopped: bool = False
    ) -> None:
        """Track the startup read; key None means the cycle left nothing unread: caught up."""
        assert self._backfill_start is not None
        self._backfill_points += points
        if key is not None and not more:
            self._caught_up.add(key)
        done = key is None and not stopped
        if self.on_backfill is not None:
            self.on_backfill(
                Backfill(
                    files_done=len(self._tails) if done else len(self._caught_up),
                    files_total=len(self._tails),
                    points=self._backfill_points,
                    seconds=time.monotonic() - self._backfill_start,
                    done=done,
                    stopped=stopped,
                )
            )
        if done or stopped:
            self._backfill_start = None
            self._caught_up.clear()

    def _release(self, keys: list[str]) -> None:
        """Forget deleted files; a run with no file left is released downstream."""
        runs = {r for k in keys for r in self._tails[k].runs}
        for run in runs:  # what a deleted file's run has held is judged before it goes
            self._flush(run)
        for k in keys:
            run = self._tails[k].log.run
            self._merge.forget(run, k)
            left = self._files_of.get(run, 1) - 1
            if left:
                self._files_of[run] = left
            else:
                self._files_of.pop(run, None)
            self._tails.pop(k).close()
            self._unsaved.pop(k, None)
            self._holding.pop(k, None)
            self._due.pop(k, None)
            self._relinked.discard(k)
            self.access.forget(k)
            log.info("released %s", k)
        self.state.forget_offsets(keys)
        if self.restart is not None:
            self.restart.released()
        alive = {r for t in self._tails.values() for r in t.runs}
        self._store_runs -= runs - alive
        for run in runs - alive:
            if self._on_release is not None:
                self._on_release(run)

    # -- what the notification stage asks about a run -------------------------

    def look_again(self, run: str) -> None:
        """Read the run's files in the next cycle, changed or not, and begin it now: what
        a process wrote just before it exited may not have been read yet (processes.py)."""
        self._pending.update(k for k, t in self._tails.items() if run in t.runs)
        self._ending.add(run)
        self._woken = True

    def run_files(self, run: str) -> list[Path]:
        """The log files followed for a run (for incident bundles)."""
        return sorted(t.log.path for t in self._tails.values() if run in t.runs)

    def checkpoints(self) -> dict[str, tuple[int, float, str]]:
        """Each checkpoint run's newest complete checkpoint (step, completion, path), over
        its roots (sources/checkpoints.py), for `status`."""
        out: dict[str, tuple[int, float, str]] = {}
        for tail in self._tails.values():
            if isinstance(tail, CheckpointTail) and (newest := tail.newest()) is not None:
                known = out.get(tail.log.run)
                if known is None or newest[:2] > known[:2]:
                    out[tail.log.run] = newest
        return out

    def own_logs(self, runs: Collection[str]) -> dict[str, list[tuple[Path, str]]]:
        """The logs followed of each of `runs` that are its own (not a file of another run
        that gives it lines, as one job log gives its ranks'), with their kinds: one pass
        over the files, however many runs (runtime/writers.py)."""
        out: dict[str, list[tuple[Path, str]]] = {}
        for tail in self._tails.values():
            if tail.log.run in runs:
                out.setdefault(tail.log.run, []).append((tail.log.path, tail.log.kind))
        return out

    def run_dir(self, run: str) -> Path | None:
        """The run's directory (where its stop file goes); None once it was released."""
        # a text log may sit beside its run's directory (discover.py): the others first
        for tail in sorted(self._tails.values(), key=lambda t: t.log.kind == "text"):
            if run in tail.runs:
                return run_directory(tail.log, run)
        return None

    def _save(self) -> None:
        self._unsaved.clear()
        self.state.save_offsets(self._checkpoint(k, t) for k, t in self._tails.items())

    def commit_soon(self) -> None:
        """Commit at the end of this cycle, not at the next interval: called when alert
        transitions were shown, so a kill -9 repeats at most one cycle's worth of them."""
        self._next_commit = 0.0

    def _commit(self) -> None:
        """Save the offsets of the files read since the last commit."""
        self._next_commit = time.monotonic() + COMMIT_SECONDS
        if self._unsaved:
            unsaved, self._unsaved = self._unsaved, {}
            self.state.save_offsets(self._checkpoint(k, t) for k, t in unsaved.items())
            for key, tail in unsaved.items():  # committed short of its held rows: again later
                if self._merge.safe(key, tail.log.run) is not None:
                    self._unsaved[key] = tail

    def _snapshot(self) -> None:
        """Save the memory with each file's read position, at a cycle's end (consistent)."""
        if self.restart is None:
            return
        # the snapshot's positions must not pass the committed offsets: a restart
        # relearns from the one up to the other
        self._commit()
        self.restart.save([t.position() for t in self._tails.values()])
