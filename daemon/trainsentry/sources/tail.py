"""Follows one log file from a byte offset, across appends, truncation and replacement.

The tailer owns everything about the file and nothing about its format: it
reads bytes from the last offset and lets the decoder say how many formed
complete records. Identity follows vector's file source: device+inode plus a
fingerprint of the first bytes, so that a file rewritten in place
(copytruncate, Lightning's header rewrite) or replaced (rename + create) is
never resumed at a stale offset, and a restarted daemon resumes exactly where
the last one stopped.

The file is kept open between reads: when the path is renamed away or deleted,
the open handle still reaches the old file, so what was appended to it before
the rotation is drained instead of lost.

A tail can also *relearn*: begin at an earlier position of the file than its
checkpoint (where the last saved alert state stood, or the start) and hand
the points up to the checkpoint back separately, as `replayed`. They were
delivered before the restart; the engine reads them again to rebuild its
windows, and nobody is told twice.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field, replace

from trainsentry.jobs.identity import member_of, rank_of_line, ranked_run
from trainsentry.point import Point, ProbeMark, Row, RunEnd, TextEvent, Trace, points_of
from trainsentry.sources.base import MAX_RECORD_BYTES, Decoded, Decoder
from trainsentry.sources.discover import LogFile, refusal
from trainsentry.sources.formats import new_decoder
from trainsentry.state.db import Checkpoint

_new = tuple.__new__
FINGERPRINT_BYTES = 64
# Bytes decoded at a time: a 1 MiB slice of torch scalars is ~20,000 points, whose
# objects the decoder makes in one go; 4 MiB cost 32 MiB more peak memory on a 1 M-point
# file (bench/ingest.py) and read no faster.
READ_CHUNK = 1 << 20
# Bytes read from one file per call (the daemon's per cycle): a backfill proceeds in
# slices of a few seconds of evaluation, so signals, heartbeats and other files get
# their turn. A slice's records are all held until they are judged: 16 MiB of torch
# scalars (~300,000 points) took the daemon's backfill of 500,000-point runs to 278 MiB
# RSS, 4 MiB to 119 MiB at the same speed (bench/backfill.py); `dump` of one such file
# held 353 MB at 64 MiB a read, 131 MB at 4.
READ_BUDGET = 4 << 20
# What one read of a live append asks for: far more than a second of a job's log,
# and under the allocator's mmap threshold (pread allocates what it asks for).
APPEND_CHUNK = 64 << 10
# the ranks one text log may name each a run of its own; a log naming more keeps the rest
MAX_RANK_RUNS = 4096


@dataclass(slots=True)
class TailRead:
    run: str = ""
    rows: list[Row] = field(default_factory=list)  # of `run`, tags with the file's prefix
    errors: list[str] = field(default_factory=list)
    more: bool = False  # stopped at the byte budget with data left to read
    gone: bool = False  # the path no longer exists and the old file is drained
    # the OS refused to stat, open or read the file (permissions, I/O error): the
    # read is retried from the same offset next time, nothing is skipped
    unreadable: str | None = None
    # a writer holds the log locked (a SQLite store mid-transaction): nothing read or
    # skipped, read again from the same place at its next change
    busy: str | None = None
    replayed_rows: list[Row] = field(default_factory=list)  # read again to relearn, see above
    # rows of other runs than `run`: a tracker's store holds many (mlflow_db.py)
    others: list[tuple[str, list[Row]]] = field(default_factory=list)
    # a text log's events, of `run`; none while relearning: text alerts are not relearned
    events: list[TextEvent] = field(default_factory=list)
    # what trackers say of their runs besides points: traces (run_trace.py) and ends
    traces: list[tuple[str, Trace]] = field(default_factory=list)
    ends: list[RunEnd] = field(default_factory=list)
    # the probe's meta and end records, of `run`; none while relearning, as events
    marks: list[ProbeMark] = field(default_factory=list)
    # what is said once without anything skipped: a bound reached (checkpoints.py)
    notes: list[str] = field(default_factory=list)
    # read again after this many seconds even if nothing changes: a checkpoint that is
    # still settling is complete once it has stayed so (checkpoints.py)
    again_in: float | None = None

    @property
    def points(self) -> list[Point]:
        got = points_of(self.run, self.rows)
        for run, rows in self.others:
            got.extend(points_of(run, rows))
        return got

    def batches(self) -> list[tuple[str, list[Row]]]:
        """Each run's rows read, `run`'s first."""
        return [(self.run, self.rows), *self.others] if self.rows else self.others

    @property
    def replayed(self) -> list[Point]:
        return points_of(self.run, self.replayed_rows)


def stat_or_say(path: str, out: TailRead) -> os.stat_result | None:
    """The path's stat; None with `out` saying why (gone, or the OS refused) when there is none."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        out.gone = True
    except OSError as exc:
        out.unreadable = f"cannot stat: {exc.strerror or exc}"
    return None


def _matches(fd: int, cp: Checkpoint) -> bool:
    """The open file is the one `cp` was taken of, unchanged up to its offset."""
    st = os.fstat(fd)
    if (cp.dev, cp.ino) != (st.st_dev, st.st_ino) or st.st_size < cp.offset:
        return False
    head = os.pread(fd, len(cp.fingerprint), 0)
    behind = os.pread(fd, len(cp.behind), cp.offset - len(cp.behind))
    return head == cp.fingerprint and behind == cp.behind


class FileTail:
    def __init__(
        self,
        log: LogFile,
        checkpoint: Checkpoint | None = None,
        *,
        relearn_from: Checkpoint | None = None,
    ) -> None:
        """Resume at `checkpoint`; or, with `relearn_from` (an earlier checkpoint of
        the same file, or one at offset 0), re-read from there up to it first; the
        read that finishes relearning stops there (`more` if new data follows).
        A file rewritten since `checkpoint` relearns nothing: what it holds now
        is new and must not pass as replayed.
        """
        self.log = log
        self.path = str(log.path)
        # where the open file lives while it is drained after a rotation: its path names
        # the new file now, and evidence must lead to the lines it quotes (`_now_named`)
        self._shown: str | None = None
        self._orphans: list[TextEvent] = []  # let go at a rotation, for the read's events
        self.skipped_records = 0
        self._fd: int | None = None
        self._dev = self._ino = 0
        self._fingerprint = b""
        self._behind = b""  # the bytes just before the offset
        self._offset = 0
        self._seen: tuple[int, int] = (-1, -1)
        self._caught_up = False  # the last read reached the end of the file
        self._prefixed: dict[tuple[str, ...], tuple[str, ...]] = {}  # a shape's tags, prefixed
        self._decoder: Decoder = new_decoder(log.kind)
        # A text log of many ranks' lines (`[rank3]: ...`, a Slurm job's output) gives each
        # event to its rank's run; one that is a rank's own log keeps its events.
        self._rank_runs: dict[int, str] | None = (
            {} if log.kind == "text" and not member_of(log.run).ranked else None
        )
        self._resume = checkpoint
        # While relearning: the checkpoint the last process committed, and its offset.
        self._committed: Checkpoint | None = None
        self._replay_until: int | None = None
        if checkpoint is not None and relearn_from is not None:
            self._committed, self._replay_until = checkpoint, checkpoint.offset
            self._resume = relearn_from if relearn_from.offset > 0 else None

    # -- public -------------------------------------------------------------

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def relearning(self) -> bool:
        return self._replay_until is not None

    @property
    def runs(self) -> set[str]:
        """The runs this file delivers rows or events of."""
        if self._rank_runs:
            return {self.log.run, *self._rank_runs.values()}
        return {self.log.run}

    def read(self, budget: int = READ_BUDGET, *, same_file: bool = False) -> TailRead:
        """Read what was appended since the last call, up to about `budget` bytes.

        `same_file`: the caller knows the path still names the file open here
        (no directory event named it since the last read), so an append is
        read by one pread and no stat (`_read_appended`): on a live fleet the
        stats, a path lookup per read, were a tenth of the daemon's syscalls.
        """
        out = TailRead(self.log.run)
        if same_file and self._caught_up and self._read_appended(out):
            return out
        self._read_path(out, budget)
        if self._orphans:  # the last event of a rotated or rewritten log, before the new one's
            out.events[:0], self._orphans = self._orphans, []
        self._caught_up = not out.more
        return out

    def _read_path(self, out: TailRead, budget: int) -> None:
        """The general read: the path's stat first, for a file renamed, replaced or gone."""
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):  # a run directory made a file: gone
            st = None
        except OSError as exc:
            out.unreadable = f"cannot stat: {exc.strerror or exc}"
            return
        if self._fd is not None and (
            st is None or (st.st_dev, st.st_ino) != (self._dev, self._ino)
        ):
            # Renamed away or deleted: finish the old file through our handle first.
            if self._shown is None:
                self._shown = self._now_named()
            self._drain(out, budget)
            if out.more:
                return
            self._close()
            if st is None:
                out.events.extend(self.let_go())  # the end of the log: nothing will continue it
                self._shown = None
                out.gone = True
                return
            self._reset(rewritten=False)
            self._shown = None
        if st is None:
            out.gone = True
            return
        if self._fd is None:
            if not self._open(out):
                return
            st = None  # stat again through the handle: the file opened may be a newer one
        self._drain(out, budget, st)

    def checkpoint(self) -> Checkpoint:
        """Where delivery stands: while relearning, still where the last process left it."""
        if self._committed is not None:
            return self._committed
        return self.position()

    def position(self) -> Checkpoint:
        """Where reading stands, relearned points included (what the alert state has seen)."""
        if self._resume is not None:
            return self._resume  # not opened yet: where the last process stopped still holds
        return Checkpoint(
            path=self.path,
            dev=self._dev,
            ino=self._ino,
            fingerprint=self._fingerprint,
            behind=self._behind,
            offset=self._offset,
            decoder_state=self._decoder.snapshot(),
        )

    def close(self) -> None:
        self._close()

    # -- internals ----------------------------------------------------------

    def _open(self, out: TailRead) -> bool:
        """Open the path, which must be a regular file inside the roots (discover.py).

        O_NONBLOCK: an open of a FIFO put where a log was would otherwise wait
        for a writer, and the daemon's one loop with it; on a regular file the
        flag changes nothing.
        """
        why = refusal(self.path, self.log.inside)
        if why is not None:
            out.unreadable = why
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            out.gone = True
            return False
        except OSError as exc:
            out.unreadable = f"cannot open: {exc.strerror or exc}"
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO between the check and the open
            os.close(fd)
            out.unreadable = "not a regular file (a FIFO, socket or device is never read as a log)"
            return False
        self._fd, self._dev, self._ino = fd, st.st_dev, st.st_ino
        if self._committed is not None and not _matches(fd, self._committed):
            # Rewritten or replaced since the last process committed: resume as it would.
            self._resume, self._committed, self._replay_until = self._committed, None, None
        cp, self._resume = self._resume, None
        if cp is not None and (cp.dev, cp.ino) == (st.st_dev, st.st_ino):
            if _matches(fd, cp):
                self._fingerprint, self._offset = cp.fingerprint, cp.offset
                self._behind = cp.behind
                self._decoder.restore(cp.decoder_state)
                return True
            # Same file, other content: rewritten in place while we were away.
            self._decoder.continue_from(cp.decoder_state)
        self._fingerprint = os.pread(fd, FINGERPRINT_BYTES, 0)
        self._offset = 0
        return True

    def _reset(self, *, rewritten: bool) -> None:
        """Start over at offset 0 with a fresh decoder; a text log's held event is let go,
        as it is: the lines that could continue it would be in the old file."""
        if self._replay_until is None:
            self._orphans.extend(self.let_go())
        previous = self._decoder.snapshot()
        self._decoder = new_decoder(self.log.kind)
        if rewritten:
            self._decoder.continue_from(previous)
        self._offset = 0
        self._seen = (-1, -1)
        self._fingerprint = b""
        self._behind = b""
        self._committed = self._replay_until = None  # what it was is gone

    def _check_rewritten(self, st: os.stat_result) -> bool:
        """Detect copytruncate and in-place rewrites of the open file.

        True when the bytes just before the offset are still to be compared:
        for a file that grew (the common case, every live read) the first
        read of the new bytes starts that far back and compares them itself,
        one syscall instead of three. The head is compared only when the
        file changed without growing, or there is nothing behind the offset
        to compare: a rewrite that keeps the bytes before the offset but
        changes the head cannot shift rows, so it cannot mislead the offset.
        """
        assert self._fd is not None
        size = st.st_size
        if (size, st.st_mtime_ns) == self._seen:
            return False  # unchanged since the last read: skip the fingerprint pread
        self._seen = (size, st.st_mtime_ns)
        verify = False
        if size < self._offset:
            self._reset(rewritten=True)
        elif self._fingerprint:
            # The head alone misses a rewrite that changes only later bytes (a
            # Lightning header grown past 64 bytes): the bytes before the offset
            # are checked too, which any rewrite that shifts rows changes.
            n = len(self._behind)
            if n and size > self._offset:
                verify = True
            elif os.pread(self._fd, len(self._fingerprint), 0) != self._fingerprint or (
                n and os.pread(self._fd, n, self._offset - n) != self._behind
            ):
                self._reset(rewritten=True)
        if len(self._fingerprint) < FINGERPRINT_BYTES:
            self._fingerprint = os.pread(self._fd, FINGERPRINT_BYTES, 0)
        return verify

    def _drain(self, out: TailRead, budget: int, st: os.stat_result | None = None) -> None:
        """Read on through the open handle; `st`: the path's stat, when it is that file."""
        fd = self._fd
        if fd is None:
            return
        try:
            if st is None:
                st = os.fstat(fd)
            verify = self._check_rewritten(st)
        except OSError as exc:
            out.unreadable = f"cannot read: {exc.strerror or exc}"
            return
        size, mtime = st.st_size, st.st_mtime
        chunk = READ_CHUNK
        spent = 0
        while self._offset < size:
            if spent >= budget:
                out.more = True
                return
            end = size if self._replay_until is None else min(size, self._replay_until)
            want = min(chunk, end - self._offset)
            back = len(self._behind) if verify else 0
            try:
                data = os.pread(fd, back + want, self._offset - back)
                if back:
                    verify = False
                    if data[:back] != self._behind:  # rewritten in place: start over
                        self._reset(rewritten=True)
                        self._fingerprint = os.pread(fd, FINGERPRINT_BYTES, 0)
                        continue
                    data = data[back:]
            except OSError as exc:
                out.unreadable = f"cannot read: {exc.strerror or exc}"
                return
            if not data:
                return  # shrank under us; the next read notices the truncation
            at_eof = self._offset + len(data) >= size
            decoded = self._decode(out, data, at_eof, mtime)
            if decoded.consumed == 0:
                if self._replay_until is not None and self._offset + len(data) >= end:
                    # the committed offset is no record boundary (cannot happen for a
                    # valid checkpoint): deliver from here on rather than stall
                    self._committed = self._replay_until = None
                    continue
                if at_eof:
                    return  # an incomplete record: wait for the writer
                if chunk > MAX_RECORD_BYTES:
                    # twice the record limit without a record's end: decoders skip what
                    # is longer (Lines, the framer's resync), so this is a decoder's
                    # fault; the bytes are skipped, said, and reading goes on
                    self._skip(out, data)
                    continue
                # one record longer than a chunk: read more at once. Not counted against
                # the budget, which bounds records read: a record at the limit must fit
                # in one read however little of the budget is left
                chunk *= 2
                continue
            spent += decoded.consumed
            chunk = READ_CHUNK
            if self._replay_until is not None and self._offset >= self._replay_until:
                # Relearned: new points come in the next read, so the daemon can let
                # every file relearn before any delivers (runtime.py reads those first).
                self._committed = self._replay_until = None
                out.more = self._offset < size
                return

    def _now_named(self) -> str:
        """The name of the open file, renamed away or deleted: logrotate's `train.log.1`,
        looked up by its inode among its old path's neighbours (one listing, once a
        rotation); the old path marked `(deleted)` where no name leads to it."""
        folder = os.path.dirname(self.path) or "."
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if (
                        entry.inode() == self._ino
                        and entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_dev == self._dev
                    ):
                        return entry.path
        except OSError:
            pass
        return f"{self.path} (deleted)"

    def _where(self, offset: int, line: int | None) -> str:
        """`path:line` of a line format's record; a binary one's byte offset, said as such."""
        path = self._shown or self.path
        return f"{path}:{line}" if line is not None else f"{path}: at byte {offset}"

    def _skip(self, out: TailRead, data: bytes) -> None:
        """Move past bytes no record could be found in, with one error."""
        self.skipped_records += 1
        where = self._where(self._offset, None)
        out.errors.append(f"{where}: no record in {len(data)} bytes: skipped")
        self._offset += len(data)
        self._behind = (self._behind + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]

    def _decode(self, out: TailRead, data: bytes, at_eof: bool, file_time: float) -> Decoded:
        """Decode bytes read at the offset into `out`; move past the records they held."""
        decoded = self._decoder.feed(data, at_eof=at_eof, file_time=file_time)
        for err in decoded.errors:
            self.skipped_records += 1
            out.errors.append(f"{self._where(self._offset + err.offset, err.line)}: {err.message}")
        target = out.rows if self._replay_until is None else out.replayed_rows
        prefix = self.log.tag_prefix
        if prefix:
            target.extend(self._prefix(decoded.rows, prefix))
        else:
            target.extend(decoded.rows)
        if decoded.events and self._replay_until is None:
            out.events.extend(self._placed(decoded.events))
        if decoded.trace:  # relearnt too: a restart keeps no trace but the logs'
            out.traces.append((self.log.run, decoded.trace))
        if decoded.ends:
            out.ends.extend(replace(e, run=self.log.run) for e in decoded.ends)
        if decoded.marks and self._replay_until is None:
            run, path = self.log.run, self.path
            out.marks.extend(replace(m, run=run, path=path) for m in decoded.marks)
        consumed = decoded.consumed
        if consumed:
            self._offset += consumed
            last = data[max(0, consumed - FINGERPRINT_BYTES) : consumed]
            self._behind = (self._behind + last)[-FINGERPRINT_BYTES:]
        return decoded

    def _read_appended(self, out: TailRead) -> bool:
        """Read what was appended since the last read, by one pread and no stat; False
        (nothing taken) when this read needs the general path.

        A live file is read after every write (a record a second, for each of
        a fleet's files): one pread from just before the offset returns the
        bytes behind it, compared to tell an append from a rewrite (as
        `_check_rewritten` does), and what follows, short of APPEND_CHUNK at
        the end of the file. No fstat, so the records' fallback stamp (formats
        without a time, `file_time`) is the time of reading rather than the
        mtime: the previous read found the end of the file, so these bytes were
        written since, and the mtime is only the last write's time either way.
        Anything else goes the general way: a file that shrank or was rewritten,
        more than a chunk appended, a short head, a relearn.
        """
        fd, back = self._fd, len(self._behind)
        if (
            fd is None
            or not back
            or self._replay_until is not None
            or len(self._fingerprint) < FINGERPRINT_BYTES
        ):
            return False
        try:
            data = os.pread(fd, back + APPEND_CHUNK, self._offset - back)
        except OSError:
            return False  # the general path says why
        n = len(data)
        if n < back or n == back + APPEND_CHUNK or data[:back] != self._behind:
            return False
        self._seen = (-1, -1)  # what the general path last saw of the file has changed
        if n > back:
            self._decode(out, data[back:], True, time.time())
        return True

    @property
    def holding(self) -> bool:
        """A text log's event is held for lines that may continue it (text_events.py)."""
        return bool(getattr(self._decoder, "holding", False))

    def let_go(self) -> list[TextEvent]:
        """The held event of a text log, let go: its log has been quiet (runtime/loop.py)."""
        let_go = getattr(self._decoder, "let_go", None)
        if let_go is None:
            return []
        return self._placed(let_go())

    def _placed(self, events: list[TextEvent]) -> list[TextEvent]:
        """The events with their run and path: built directly, dataclasses.replace costs
        4 µs an event (a text log's every line is one). An event whose first line names a
        rank goes to that rank's run, at most MAX_RANK_RUNS of them a file (a log that
        names a million ranks is no job's)."""
        run, path, ranks = self.log.run, self._shown or self.path, self._rank_runs
        if ranks is None:
            return [
                TextEvent(path, e.line, e.wall_time, e.lines, e.kind, e.level, run, e.cuts)
                for e in events
            ]
        out = []
        for e in events:
            placed = run
            rank = rank_of_line(e.lines[0]) if e.lines else None
            if rank is not None:
                placed = ranks.get(rank) or run
                if placed is run and len(ranks) < MAX_RANK_RUNS:
                    placed = ranks[rank] = ranked_run(run, rank)
            out.append(
                TextEvent(path, e.line, e.wall_time, e.lines, e.kind, e.level, placed, e.cuts)
            )
        return out

    def _prefix(self, rows: list[Row], prefix: str) -> list[Row]:
        """The rows with the file's tag prefix (Keras' train/, validation/), one tuple per shape."""
        cache = self._prefixed
        out = []
        for step, wall, tags, values in rows:
            named = cache.get(tags)
            if named is None:
                if len(cache) >= 4096:
                    cache.clear()
                named = cache[tags] = tuple(prefix + t for t in tags)
            out.append(_new(Row, (step, wall, named, values)))
        return out

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
