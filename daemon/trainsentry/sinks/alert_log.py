"""`--alerts-jsonl FILE`: every alert transition shown, appended as one JSON line.

Other tools tail this file, so a line is appended whole or not at all: the
file is unbuffered, and a write the OS cut short is finished before the next.
A full disk under it must not stop the terminal lines: a failed append is said
once (and its recovery once), the lines of that batch are counted as lost, and
the next batch tries again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from trainsentry.alert import Transition


class AlertLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        # unbuffered: a failed write leaves nothing in a buffer to be written twice later
        self._file = path.open("ab", buffering=0)
        self.lost = 0  # transitions not appended since appends last worked

    def append(self, transitions: Sequence[Transition]) -> None:
        text = "".join(json.dumps(t.as_dict(), ensure_ascii=False) + "\n" for t in transitions)
        self._append(text.encode(), len(transitions))

    def _append(self, data: bytes, count: int) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[self._file.write(view) or 0 :]
        except OSError as exc:
            if not self.lost:
                print(
                    f"trainsentry: cannot append to {self.path}: {exc}; "
                    "alerts still go to the terminal and the receivers",
                    file=sys.stderr,
                    flush=True,
                )
            self.lost += count
            return
        if self.lost:
            print(
                f"trainsentry: appending to {self.path} again; "
                f"{self.lost} transition(s) could not be written",
                file=sys.stderr,
                flush=True,
            )
            self.lost = 0

    def close(self) -> None:
        self._file.close()
