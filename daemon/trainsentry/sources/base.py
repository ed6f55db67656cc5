"""The seam between the tailer (files, offsets, rotation) and the decoders (bytes → samples).

A decoder never touches the file system: the tailer hands it the bytes from its
current offset on, and the decoder says how many of them formed complete
records. Bytes of a record still being written are left unconsumed and handed
again, longer, on the next read — so a partial record is neither lost nor
parsed twice. Whatever a decoder must remember across records (a CSV header,
TF1 plugin metadata seen on a tag's first event) goes into `snapshot()` so a
restarted daemon resuming mid-file decodes exactly as the one before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from trainsentry.point import Sample


@dataclass(slots=True)
class DecodeError:
    """A skipped record: `offset` is relative to the start of the bytes fed."""

    offset: int
    message: str


@dataclass(slots=True)
class Decoded:
    consumed: int
    samples: list[Sample] = field(default_factory=list)
    errors: list[DecodeError] = field(default_factory=list)


class Decoder(Protocol):
    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        """Decode complete records at the start of `data`.

        `at_eof` is true when `data` runs to the current end of the file; a
        decoder may still leave a trailing incomplete record unconsumed.
        `file_time` is the file's mtime, the fallback wall time for formats
        whose records may lack one.
        """
        ...

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state needed to resume decoding at the current offset."""
        ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def continue_from(self, previous: dict[str, Any]) -> None:
        """Called on a fresh decoder when the same path was rewritten in place.

        Lightning's CSVLogger rewrites metrics.csv from the top when a new
        column appears; a decoder that can tell a rewrite from a new file uses
        the previous snapshot to skip records already delivered.
        """
        ...


def complete_lines(data: bytes | memoryview) -> tuple[int, list[bytes]]:
    """The newline-terminated lines at the start of `data`, and how many bytes they span.

    For line formats (JSONL, CSV): the bytes after the last newline are a line
    still being written, left for the next read even at end of file.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    end = raw.rfind(b"\n") + 1
    if end == 0:
        return 0, []
    lines = raw.split(b"\n")
    lines.pop()
    return end, lines
