"""Randomised write / partial / rotate / truncate / delete / restart / read sequences.

A model of the file's life says which lines the tailer must deliver, and the
tailer must deliver exactly those, once each, in order (vector's file source
is tested the same way).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trainsentry.sources.discover import Root
from trainsentry.sources.tail import FileTail


def encode(step: int) -> bytes:
    return (json.dumps({"step": step, "loss": 0.5}) + "\n").encode()


class TailMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tail-"))
        self.path = self.dir / "metrics.jsonl"
        self.path.touch()
        self.tail = self._new_tail(None)
        self.next_id = 0
        self.partial: bytes | None = None  # the rest of a half-written line
        self.partial_id = -1
        self.cur: list[int] = []  # complete lines in the file now at `path`
        self.read_upto = 0
        self.cur_open = False  # the tailer's handle is on the file now at `path`
        self.old_unread: list[int] = []  # lines it can still drain from a rotated file
        self.expected: list[int] = []
        self.delivered: list[int] = []
        self.relinked = False  # renamed or deleted since the last read: a directory event

    def _new_tail(self, checkpoint: object) -> FileTail:
        log = Root.watched(self.dir).describe(self.path)
        assert log is not None
        return FileTail(log, checkpoint)  # type: ignore[arg-type]

    def _append(self, data: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(data)

    @rule(n=st.integers(1, 5))
    def write(self, n: int) -> None:
        data = b""
        if self.partial is not None:
            data += self.partial
            self.cur.append(self.partial_id)
            self.partial = None
        for _ in range(n):
            data += encode(self.next_id)
            self.cur.append(self.next_id)
            self.next_id += 1
        self._append(data)

    @rule(cut=st.integers(1, 20))
    def write_half_a_line(self, cut: int) -> None:
        if self.partial is not None:
            return
        line = encode(self.next_id)
        self._append(line[:cut])
        self.partial, self.partial_id = line[cut:], self.next_id
        self.next_id += 1

    @rule()
    def rotate(self) -> None:
        os.replace(self.path, self.dir / "metrics.jsonl.1")
        self.path.touch()
        self._file_replaced()

    @rule()
    def delete(self) -> None:
        self.path.unlink()
        self.path.touch()
        self._file_replaced()

    def _file_replaced(self) -> None:
        self.relinked = True
        if self.cur_open:
            self.old_unread += self.cur[self.read_upto :]
        self.cur, self.read_upto, self.cur_open, self.partial = [], 0, False, None

    @rule()
    def truncate(self) -> None:
        with self.path.open("r+b") as f:
            f.truncate(0)
        self.cur, self.read_upto, self.partial = [], 0, None

    @rule()
    def restart(self) -> None:
        checkpoint = self.tail.checkpoint()
        self.tail.close()
        self.tail = self._new_tail(checkpoint)
        self.old_unread = []  # the handle on a rotated file dies with the process
        self.cur_open = False  # a new process has opened nothing yet

    @rule()
    def read(self) -> None:
        self._read(same_file=False)

    @rule()
    def read_after_writes_alone(self) -> None:
        """As the daemon reads a file no directory event named (truncation is none)."""
        if not self.relinked:
            self._read(same_file=True)

    def _read(self, *, same_file: bool) -> None:
        got = self.tail.read(same_file=same_file)
        self.relinked = False
        assert not got.more
        self.delivered += [p.step for p in got.points]
        self.expected += self.old_unread + self.cur[self.read_upto :]
        self.old_unread, self.read_upto, self.cur_open = [], len(self.cur), True

    @invariant()
    def delivered_exactly_what_the_model_says(self) -> None:
        assert self.delivered == self.expected

    def teardown(self) -> None:
        self.tail.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TailMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_tail_follows_any_sequence_of_file_operations = TailMachine.TestCase
