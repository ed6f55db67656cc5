"""`path:line` of a text log's evidence is the file's real line, whatever came before it.

A property test: a log of plain lines, blank lines, tqdm's carriage-return runs,
tracebacks and over-long lines is appended in random pieces, read between the
pieces, rotated (renamed, a new file begun) and resumed from a checkpoint (a
restart) at random points. Plain lines passed on together (one event for many,
sources/text_scan.py) are taken as the line events they stand for. Every event
must cite a path and line number at which the file on disk has that line
(`sed -n Np`, an editor's line N), every line must arrive once, and every skip
must name the over-long line. The record limit is lowered so that an over-long
line costs bytes, not megabytes; the tail's reads are made small (16 bytes:
lines split across reads everywhere) or twice the limit (many plain lines in
one read, between the lines that need more).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import TextEvent
from trainsentry.sources import base, tail, textlog
from trainsentry.sources.discover import Root
from trainsentry.sources.tail import FileTail
from trainsentry.sources.text_events import TRACEBACK, clean
from trainsentry.sources.text_scan import PLAIN, plain_events

LIMIT = 64  # the record limit in this test


def piece(kind: str, k: int) -> list[str]:
    """The lines one entry of the log writes; `k` makes each line unique."""
    if kind == "plain":
        return [f"step {k} loss 0.5"]
    if kind == "blank":
        return [""]
    if kind == "tqdm":
        return [f"{k}:  10%|#   |\r{k}:  50%|##  |\r{k}: 100%|####|"]
    # Over twice the limit: no read (at most twice the limit) holds it whole, so it is
    # skipped; a line between the limit and twice it may be read whole, and cut for showing.
    if kind == "long":
        return [f"{k} " + "x" * (2 * LIMIT + k % 50)]
    if kind == "long_tqdm":  # a progress bar redrawn past the limit with no newline
        return ["\r".join(f"{k}: {p}%" for p in range(0, 100, 7)) + "\r" * 2 * LIMIT]
    return [TRACEBACK, '  File "train.py", line 9, in <module>', f"ValueError: bad batch {k}"]


KINDS = st.sampled_from(["plain", "blank", "tqdm", "long", "long_tqdm", "traceback"])
ACTIONS = st.lists(
    st.tuples(st.integers(1, 40), st.sampled_from(["read", "read", "read", "rotate", "restart"])),
    max_size=30,
)


class Follower:
    """A FileTail on `train.log` as the daemon drives it: reads, rotations, restarts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "train.log"
        self.path.touch()
        self.rotations = 0
        self.events: list[tuple[TextEvent, list[str]]] = []
        self.errors: list[tuple[int, list[str]]] = []
        self.tail = self._tail(None)

    def _tail(self, checkpoint: object) -> FileTail:
        log = Root.watched(self.folder).describe(self.path)
        assert log is not None and log.kind == "text"
        return FileTail(log, checkpoint)  # type: ignore[arg-type]

    def read(self) -> None:
        while True:
            got = self.tail.read(budget=256)
            self.said(got.events, got.errors)
            if not got.more:
                return

    def said(self, events: list[TextEvent], errors: list[str]) -> None:
        """What the tail said, each with the file it names as it is now: the evidence
        must hold when it is given (a later rotation moves the file on)."""
        for event in [x for e in events for x in (plain_events(e) if e.kind == PLAIN else [e])]:
            self.events.append((event, lines_on_disk(event.path)))
        for error in errors:
            found = re.match(r"^(.*):(\d+): a line longer than", error)
            assert found is not None, error
            self.errors.append((int(found.group(2)), lines_on_disk(found.group(1))))

    def rotate(self) -> None:
        """logrotate's rename and new file, the daemon reading the log before and after."""
        self.read()
        self.rotations += 1
        self.path.rename(self.folder / f"train.log.{self.rotations}")
        self.path.touch()
        self.read()

    def restart(self) -> None:
        checkpoint = self.tail.checkpoint()
        self.tail.close()
        self.tail = self._tail(checkpoint)

    def finish(self) -> None:
        self.read()
        self.said(self.tail.let_go(), [])
        self.tail.close()


def lines_on_disk(path: str) -> list[str]:
    """The file's lines as `sed -n Np` numbers them: a newline ends a line, `\\r` does not."""
    return Path(path).read_bytes().decode().split("\n")


@settings(max_examples=150, deadline=None)
@given(st.lists(KINDS, max_size=40), ACTIONS, st.sampled_from([16, 2 * LIMIT]))
def test_evidence_cites_the_files_real_line_across_skips_carriage_returns_rotations(
    kinds: list[str], actions: list[tuple[int, str]], chunk: int
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lines-"))
    lines = [line for k, kind in enumerate(kinds) for line in piece(kind, k)]
    data = "".join(line + "\n" for line in lines).encode()
    with (
        mock.patch.object(base, "MAX_RECORD_BYTES", LIMIT),
        mock.patch.object(tail, "MAX_RECORD_BYTES", LIMIT),
        mock.patch.object(textlog, "MAX_RECORD_BYTES", LIMIT),
        mock.patch.object(tail, "READ_CHUNK", chunk),
        mock.patch.object(tail, "APPEND_CHUNK", chunk),
    ):
        try:
            follower = Follower(folder)
            at = 0
            for size, action in actions:
                # append a piece, cut anywhere (mid-line too); rotate only at a line's end
                cut = min(len(data), at + size)
                if action == "rotate":
                    cut = data.find(b"\n", at) + 1 or len(data)
                with follower.path.open("ab") as f:
                    f.write(data[at:cut])
                at = cut
                if action == "rotate":
                    follower.rotate()
                elif action == "restart":
                    follower.restart()
                else:
                    follower.read()
            with follower.path.open("ab") as f:
                f.write(data[at:])
            follower.finish()

            quoted = []
            for event, on_disk in follower.events:
                assert 1 <= event.line <= len(on_disk), (event, on_disk)
                assert event.lines[0] == clean(on_disk[event.line - 1])[0], (event, on_disk)
                quoted += event.lines
            told = [clean(x)[0] for x in lines if x.strip() and len(x) < LIMIT]
            told = [x for x in told if x.strip()]  # a carriage-return run may redraw to nothing
            assert [x for x in quoted if x] == told  # every line once, in order

            skipped = [x for x in lines if len(x) >= LIMIT]
            assert len(follower.errors) == len(skipped)
            for line, on_disk in follower.errors:
                assert len(on_disk[line - 1]) >= LIMIT, (line, on_disk)
        finally:
            shutil.rmtree(folder)
