"""A checkpoint root followed as a series: one row per checkpoint, once it is complete.

The checkpoints a job saves say what a crash would cost, and whether the next
save has room; none of it is in the logs. So each *checkpoint root* (the
directory a job saves into, checkpoint_files.py says which) is followed by
this tail beside the run's logs, as the MLflow file store's run directory is:
each read lists the root (os.scandir, bounded), looks into the entries not
told yet, and hands on a row for each that became complete:

    step = the step it holds, wall time = its completion (the newest mtime of its files),
    checkpoint/step, checkpoint/bytes, checkpoint/files, checkpoint/partial = 0

on the run the root belongs to (discover.py: a `checkpoints/` folder's run is
its parent's, any other root's its own). A folder left incomplete is told once
as `checkpoint/partial = 1`; every so often the root's filesystem is looked at
for the room the next save needs (`checkpoint/free_bytes`, and `checkpoint/room`:
how many checkpoints of the newest one's size fit), a row at the newest
checkpoint's step and stamp. `replay` and `dump` read a
root through this same tail, so what a backtest says of checkpoints is what the
daemon said.

Complete means the writer is done with it:

- a file or folder stopped changing: its newest mtime is SETTLE_SECONDS old, or
  it looked the same (files, bytes, newest mtime) at two reads SETTLE_SECONDS
  apart (a writer whose clock is ahead of ours, on a network filesystem);
- and a folder has what its framework writes last (HF's `trainer_state.json`,
  torch.distributed.checkpoint's `.metadata`), or is named by its root's pointer
  (DeepSpeed's `latest`, Megatron's `latest_checkpointed_iteration.txt`) where
  there is one; and holds no `*.tmp` / `*.partial` file;
- a folder still short of that PARTIAL_SECONDS after its newest file, or one a
  framework stages a save in (`tmp-checkpoint-500`, Orbax's `*.orbax-checkpoint-tmp-*`)
  left that long, is partial: a save that died.

Nothing here follows a symlink: an entry that is one is skipped (a pointer such
as a symlinked `latest` is read with readlink, never opened), so a link out of
the root or a loop is never walked. A folder's files are counted up to
MAX_FILES, a root's entries up to MAX_ENTRIES, each said once; a read looks at
SCAN_FILES files at most and leaves the rest for the next read. A name that
carries a step no log could hold (10^30) is a bad record: skipped, said and
counted, as any source's.

What was told is kept with the read offsets (the names told, and how many ever
were), so a restarted daemon does not tell a checkpoint twice; a restored alert
state that predates some of them relearns those (`relearn_from`), as a log's
bytes are relearned.
"""

from __future__ import annotations

import math
import os
import stat
import time
from dataclasses import dataclass

from trainsentry.point import CHECKPOINT_PREFIX, CHECKPOINT_STEP, Row
from trainsentry.sources.checkpoint_files import (
    DEEPSPEED_POINTER,
    FRAMEWORK_METADATA,
    MEGATRON_POINTER,
    PARTIAL_SUFFIXES,
    BadStep,
    checkpoint_file,
    folder_by_name,
    framework_folder,
    marker,
    named_step,
    pointer,
    staged,
    step_of,
)
from trainsentry.sources.discover import LogFile
from trainsentry.sources.names import safe_name
from trainsentry.sources.tail import TailRead
from trainsentry.state.db import Checkpoint

_new = tuple.__new__

# A checkpoint is complete once its files have not changed for this long. torch.save and
# safetensors write a file in a stream of writes milliseconds apart; 10 s also spans a
# network filesystem's client flushing a writer's pages every 5 s.
SETTLE_SECONDS = 10.0
# ... and this long where its framework's last file is there (HF's trainer_state.json,
# DCP's .metadata, Orbax's _CHECKPOINT_METADATA) or its root's pointer names it: the
# writer closed every other file before, and closing flushes them (NFS's close-to-open),
# so only the last file's own few bytes are left to land.
MARKED_SETTLE_SECONDS = 1.0
# A folder without its last file this long after anything in it changed is a save that
# died: an HF or DCP save writes its last file seconds after the others (a sharded
# save of a large model, minutes); ten minutes without a byte is a writer that is gone.
PARTIAL_SECONDS = 600.0
# The root's free space is looked at (one statvfs) at most this often: it changes with
# saves, minutes apart, and a disk filling up over a minute is told a minute late.
FREE_SECONDS = 60.0
# Bounds: a root lists at most this many entries a read (a job keeps tens of
# checkpoints; more is a save_total_limit never set, read in part), a checkpoint
# counts at most this many files (a DCP save of a thousand ranks writes a file per
# rank), and a read looks at most at SCAN_FILES files, the rest at the next read.
MAX_ENTRIES = 10_000
MAX_FILES = 10_000
SCAN_FILES = 50_000
MAX_DEPTH = 8  # folders within a checkpoint (Orbax nests a few)
# A checkpoint being written is looked into at most this often, however many writes wake
# its root (a save of a thousand shard files raises an event per write): a look stats
# every file of it.
LOOK_EVERY = 1.0
POINTER_BYTES = 64

STEP_TAG = CHECKPOINT_STEP
BYTES_TAG = CHECKPOINT_PREFIX + "bytes"
FILES_TAG = CHECKPOINT_PREFIX + "files"
PARTIAL_TAG = CHECKPOINT_PREFIX + "partial"
FREE_TAG = CHECKPOINT_PREFIX + "free_bytes"
ROOM_TAG = CHECKPOINT_PREFIX + "room"
COMPLETE_TAGS = (STEP_TAG, BYTES_TAG, FILES_TAG, PARTIAL_TAG)
PARTIAL_TAGS = (PARTIAL_TAG,)
ROOM_TAGS = (FREE_TAG, ROOM_TAG)

# what an entry is, by its name: how its completeness is judged (CONFIGURED: a folder of
# a name the config gives, `checkpoint_names`)
FILE, HF, DEEPSPEED, MEGATRON, FLAX, STAGED, NAMED, CONFIGURED = (
    "file", "hf", "deepspeed", "megatron", "flax", "staged", "named", "configured",
)  # fmt: skip
_KIND_BY_PREFIX = (
    ("checkpoint-", HF),
    ("global_step", DEEPSPEED),
    ("iter_", MEGATRON),
    ("checkpoint_", FLAX),
)
# how an entry was told: as a checkpoint, as a partial one, or not at all (a bad step; a
# folder named with a step that held no checkpoint's files for PARTIAL_SECONDS)
COMPLETE, PARTIAL, BAD, NONE = "complete", "partial", "bad", "none"


@dataclass(slots=True)
class _Look:
    """What one look into an entry found."""

    files: int = 0
    bytes: int = 0
    newest: int = 0  # mtime, ns
    top: frozenset[str] = frozenset()  # the names directly inside a folder
    unfinished: bool = False  # a *.tmp / *.partial file inside
    capped: bool = False  # more files than MAX_FILES


class CheckpointTail:
    """Follows one checkpoint root (see the module)."""

    def __init__(
        self,
        log: LogFile,
        checkpoint: Checkpoint | None = None,
        *,
        relearn_from: Checkpoint | None = None,
    ) -> None:
        self.log = log
        self.path = str(log.path)
        self.skipped_records = 0
        self._dev = self._ino = 0
        self._told: dict[str, str] = {}  # entry name → how it was told (kept while it exists)
        self._count = 0  # entries ever told: the offset a restart compares
        # (step, bytes, completion) of the newest complete checkpoint, and its name
        self._newest: tuple[int, int, float] | None = None
        self._newest_name = ""
        # entry name → (what it looked like, when it first looked so, monotonic)
        self._steady: dict[str, tuple[tuple[int, int, int], float]] = {}
        # entry name → (not looked into again before, judged again at), monotonic
        self._later: dict[str, tuple[float, float]] = {}
        self._said: set[str] = set()
        self._free_at = -math.inf
        self._relearn: set[str] = set()  # names told before the restored state saw them
        if checkpoint is not None:
            state = checkpoint.decoder_state
            self._told = {str(k): str(v) for k, v in state.get("told", {}).items()}
            self._count = checkpoint.offset
            self._dev, self._ino = checkpoint.dev, checkpoint.ino
            newest = state.get("newest")
            self._newest = (int(newest[0]), int(newest[1]), float(newest[2])) if newest else None
            self._newest_name = str(state.get("newest_name", ""))
            if relearn_from is not None:
                seen = relearn_from.decoder_state.get("told", {})
                told = {n for n, how in self._told.items() if how in (COMPLETE, PARTIAL)}
                self._relearn = told - set(seen)

    @property
    def runs(self) -> set[str]:
        return {self.log.run}

    @property
    def offset(self) -> int:
        return self._count

    @property
    def relearning(self) -> bool:
        return bool(self._relearn)

    def newest(self) -> tuple[int, float, str] | None:
        """The newest complete checkpoint told (step, completion, path): the last good one
        a restart would resume from, as `status` shows it."""
        if self._newest is None:
            return None
        step, _, wall = self._newest
        return step, wall, os.path.join(self.path, self._newest_name)

    # -- reading ----------------------------------------------------------------

    def read(self, budget: int = 0, *, same_file: bool = False) -> TailRead:
        """The checkpoints completed (or left partial) since the last read, in step order;
        `again_in` when one is still settling (see the module)."""
        out = TailRead(self.log.run)
        try:
            st = os.lstat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            out.gone = True
            return out
        except OSError as exc:
            out.unreadable = f"cannot stat: {exc.strerror or exc}"
            return out
        if not stat.S_ISDIR(st.st_mode):  # replaced by a file, or by a symlink
            out.gone = True
            return out
        self._dev, self._ino = st.st_dev, st.st_ino
        listed = self._list(out)
        if listed is None:
            return out
        entries, pointers, whole = listed
        if whole:  # what is no longer there is forgotten (HF's save_total_limit rotates)
            present = {name for _, name, _ in entries}
            self._told = {n: how for n, how in self._told.items() if n in present}
            self._steady = {n: s for n, s in self._steady.items() if n in present}
            self._later = {n: t for n, t in self._later.items() if n in present}
        now, mono = time.time(), time.monotonic()
        relearning = bool(self._relearn)
        rows: list[tuple[int, Row, bool]] = []  # (step, row, relearned)
        scanned = 0
        waiting = math.inf
        for step, name, kind in sorted(entries):
            if name in self._told and name not in self._relearn:
                continue
            later = self._later.get(name)
            if later is not None and later[0] > mono:
                waiting = min(waiting, later[0] - mono)  # what woke it is looked at then
                continue
            if scanned >= SCAN_FILES:
                out.more = True
                break
            look = self._look(os.path.join(self.path, name), kind, out)
            if look is None:
                continue  # gone between the listing and the look, or unreadable now
            scanned += look.files + 1
            how, settles = self._judge(name, kind, step, look, pointers, now, mono)
            if how is None:
                waiting = min(waiting, settles)
                self._later[name] = (mono + min(settles, LOOK_EVERY), mono + settles)
                continue
            self._later.pop(name, None)
            relearned = name in self._relearn
            if how == COMPLETE:
                values = (float(step), float(look.bytes), float(look.files), 0.0)
                rows.append(
                    (step, _new(Row, (step, look.newest / 1e9, COMPLETE_TAGS, values)), relearned)
                )
                if self._newest is None or step >= self._newest[0]:
                    self._newest = (step, look.bytes, look.newest / 1e9)
                    self._newest_name = name
            elif how == PARTIAL:
                rows.append(
                    (step, _new(Row, (step, look.newest / 1e9, PARTIAL_TAGS, (1.0,))), relearned)
                )
            if name not in self._told:
                self._count += 1
            self._told[name] = how
            self._steady.pop(name, None)
        self._relearn.clear()
        for _, row, relearned in sorted(rows, key=lambda r: r[0]):
            (out.replayed_rows if relearned else out.rows).append(row)
        if waiting < math.inf:
            out.again_in = max(0.1, waiting)
        if not relearning and mono - self._free_at >= FREE_SECONDS:
            self._room(out, mono)
        return out

    def _list(
        self, out: TailRead
    ) -> tuple[list[tuple[int, str, str]], dict[str, int | None], bool] | None:
        """The root's checkpoint entries (step, name, kind), its pointers' steps, and whether
        the listing is whole (not cut at MAX_ENTRIES)."""
        entries: list[tuple[int, str, str]] = []
        pointers: dict[str, int | None] = {}
        listed = 0
        whole = True
        try:
            with os.scandir(self.path) as it:
                for entry in it:
                    listed += 1
                    if listed > MAX_ENTRIES:
                        whole = False
                        self._note(
                            out,
                            "entries",
                            f"{safe_name(self.path)}: more than {MAX_ENTRIES:,} entries: the"
                            f" first {MAX_ENTRIES:,} listed are followed",
                        )
                        break
                    name = entry.name
                    if pointer(name):
                        if name in (DEEPSPEED_POINTER, MEGATRON_POINTER):
                            pointers[name] = _pointed(entry)
                        continue
                    if self._told.get(name) == BAD:
                        entries.append((-1, name, ""))
                        continue
                    found = _entry(entry)
                    if found is None:
                        continue
                    digits, kind = found
                    try:
                        step = step_of(digits)
                    except BadStep as exc:
                        self._bad(out, name, str(exc))
                        entries.append((-1, name, ""))
                        continue
                    entries.append((step, name, kind))
        except FileNotFoundError:
            out.gone = True
            return None
        except OSError as exc:
            out.unreadable = f"cannot list: {exc.strerror or exc}"
            return None
        return entries, pointers, whole

    def _bad(self, out: TailRead, name: str, why: str) -> None:
        """A name whose step is out of range: a bad record, skipped, said and counted once."""
        if name not in self._told:
            self._count += 1
            self._told[name] = BAD
            self._say(out, f"{safe_name(os.path.join(self.path, name))}: {why}: no step")

    def _look(self, path: str, kind: str, out: TailRead) -> _Look | None:
        """Count a checkpoint's files and bytes and find its newest mtime, by scandir, no
        symlink followed; None when it is gone or cannot be read now."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if kind == FILE:
            if not stat.S_ISREG(st.st_mode):
                return None
            return _Look(1, st.st_size, st.st_mtime_ns)
        look = _Look(newest=st.st_mtime_ns)
        top: set[str] = set()
        stack = [(path, 0)]
        while stack:
            folder, depth = stack.pop()
            try:
                with os.scandir(folder) as it:
                    for entry in it:
                        if depth == 0:
                            top.add(entry.name)
                        if entry.is_symlink():
                            continue  # never followed: out of the root, or a loop
                        if entry.name.endswith(PARTIAL_SUFFIXES):
                            look.unfinished = True
                        try:
                            est = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        look.newest = max(look.newest, est.st_mtime_ns)
                        if stat.S_ISDIR(est.st_mode):
                            if depth + 1 < MAX_DEPTH:
                                stack.append((entry.path, depth + 1))
                            continue
                        if look.files >= MAX_FILES:
                            look.capped = True
                            continue
                        look.files += 1
                        look.bytes += est.st_size
            except FileNotFoundError:
                if folder == path:
                    return None
            except OSError as exc:
                if folder == path:
                    out.unreadable = f"cannot list {safe_name(path)}: {exc.strerror or exc}"
                    return None
        look.top = frozenset(top)
        if look.capped:
            self._note(
                out,
                "files",
                f"{safe_name(path)}: a checkpoint of more than {MAX_FILES:,} files: its size is"
                f" that of the first {MAX_FILES:,} counted (said once for the checkpoints of"
                f" {safe_name(self.path)})",
            )
        return look

    def _judge(
        self,
        name: str,
        kind: str,
        step: int,
        look: _Look,
        pointers: dict[str, int | None],
        now: float,
        mono: float,
    ) -> tuple[str | None, float]:
        """How the entry is told now (COMPLETE, PARTIAL), or None with the seconds until it
        may be (see the module)."""
        quiet = now - look.newest / 1e9
        signature = (look.files, look.bytes, look.newest)
        seen = self._steady.get(name)
        if seen is None or seen[0] != signature:
            self._steady[name] = (signature, mono)
            steady = 0.0
        else:
            steady = mono - seen[1]
        marked = _marked(kind, name, step, look, pointers)
        if marked is None:  # a folder named with a step holding no checkpoint's files (yet)
            return (None, SETTLE_SECONDS) if quiet < PARTIAL_SECONDS else (NONE, 0.0)
        settle = MARKED_SETTLE_SECONDS if marked == MARKED else SETTLE_SECONDS
        settled = max(quiet, steady) >= settle
        if settled and marked != MISSING and not look.unfinished:
            return COMPLETE, 0.0
        if quiet >= PARTIAL_SECONDS:
            return PARTIAL, 0.0
        wait = settle - max(quiet, steady) if not settled else PARTIAL_SECONDS - quiet
        return None, wait

    def _room(self, out: TailRead, mono: float) -> None:
        """The root's free space, and how many checkpoints of the newest one's size fit: at
        that checkpoint's step and stamp, so a look moves no run's time (a run whose job
        ended does not look alive for its disk being looked at) and replaces the last."""
        if self._newest is None or self._newest[1] <= 0:
            return
        self._free_at = mono
        try:
            fs = os.statvfs(self.path)
        except OSError:
            return
        free = fs.f_bavail * fs.f_frsize
        step, size, wall = self._newest
        out.rows.append(_new(Row, (step, wall, ROOM_TAGS, (float(free), free / size))))

    def _say(self, out: TailRead, message: str) -> None:
        """A bad record: skipped, said once and counted."""
        if message not in self._said:
            self._said.add(message)
            self.skipped_records += 1
            out.errors.append(message)

    def _note(self, out: TailRead, bound: str, message: str) -> None:
        """A bound of the root reached: said once, nothing skipped."""
        if bound not in self._said:
            self._said.add(bound)
            out.notes.append(message)

    # -- the read position --------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        state: dict[str, object] = {"told": dict(self._told)}
        if self._newest is not None:
            state["newest"] = list(self._newest)
            state["newest_name"] = self._newest_name
        return Checkpoint(
            path=self.path, dev=self._dev, ino=self._ino, fingerprint=b"", offset=self._count,
            decoder_state=state,
        )  # fmt: skip

    def position(self) -> Checkpoint:
        return self.checkpoint()

    def close(self) -> None:
        """Nothing is held open between reads."""


def _entry(entry: os.DirEntry[str]) -> tuple[str, str] | None:
    """(step digits, kind) of a root's entry that is (or may be) a checkpoint; None else."""
    try:
        if entry.is_symlink():
            return None
        is_dir = entry.is_dir(follow_symlinks=False)
    except OSError:
        return None
    name = entry.name
    if not is_dir:
        digits = checkpoint_file(name)
        return (digits, FILE) if digits is not None else None
    digits = folder_by_name(name)
    if digits is not None:
        if staged(name):
            return digits, STAGED
        if not framework_folder(name):
            return digits, CONFIGURED
        kind = next(k for prefix, k in _KIND_BY_PREFIX if name.startswith(prefix))
        return digits, kind
    digits = named_step(name)
    return (digits, NAMED) if digits is not None else None


# what an entry's files say of its completeness, besides settling (`_marked`)
MARKED, UNMARKED, MISSING = "marked", "unmarked", "missing"


def _marked(
    kind: str, name: str, step: int, look: _Look, pointers: dict[str, int | None]
) -> str | None:
    """MARKED where the entry has what its framework writes last (or its root's pointer
    names it), MISSING where it lacks that yet, UNMARKED where its framework writes no
    such thing (its files settling is all there is); None for a folder named with a step
    that holds no checkpoint's files at all (not a checkpoint, or not one yet)."""
    if kind in (FILE, FLAX, CONFIGURED):
        return UNMARKED
    if kind == STAGED:
        return MISSING
    if kind == HF:
        return MARKED if "trainer_state.json" in look.top else MISSING
    if kind in (DEEPSPEED, MEGATRON):
        pointer = DEEPSPEED_POINTER if kind == DEEPSPEED else MEGATRON_POINTER
        if pointer not in pointers:
            return UNMARKED
        pointed = pointers[pointer]
        return MARKED if pointed is not None and pointed >= step else MISSING
    if any(n.endswith(".distcp") for n in look.top):  # DCP: its coordinator writes .metadata last
        return MARKED if ".metadata" in look.top else MISSING
    if look.top & FRAMEWORK_METADATA:
        return MARKED
    return UNMARKED if any(marker(name, n) for n in look.top) else None


def _pointed(entry: os.DirEntry[str]) -> int | None:
    """The step a pointer file names (DeepSpeed's `global_step100`, Megatron's `100`), read
    without following a symlink: a symlinked pointer is read with readlink."""
    try:
        if entry.is_symlink():
            text = os.path.basename(os.readlink(entry.path))
        elif entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
            try:
                text = os.read(fd, POINTER_BYTES).decode("utf-8", "replace").strip()
            finally:
                os.close(fd)
        else:
            return None
    except OSError:
        return None
    digits = named_step(text) if not text.isdigit() else text
    if digits is None:
        return None
    try:
        return step_of(digits)
    except BadStep:
        return None
