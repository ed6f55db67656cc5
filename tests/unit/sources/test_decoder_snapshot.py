"""A decoder's state survives a snapshot and restore mid-file, for each text format.

The tailer keeps a decoder's snapshot in state.db (through JSON) with the
file's offset, and a restarted daemon resumes from it: a JSONL file's step
counter for lines without a step, a CSV file's header and delimiter. Whatever
state a format keeps, the points read in two halves across a restore must be
those of one continuous read; one test for both, so that neither format is
held to less.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from trainsentry.sources.base import Decoder
from trainsentry.sources.csvlog import CsvDecoder
from trainsentry.sources.jsonl import JsonlDecoder

FILE_TIME = 1_700_000_000.0

# every other line without a step: numbered by the counter the snapshot must carry
JSONL = b"".join(
    (json.dumps({"loss": i} if i % 2 else {"step": i, "loss": i}) + "\n").encode()
    for i in range(20)
)
# the header and its `;` delimiter are read once, before the cut
CSV = b"epoch;loss;val_loss\r\n" + b"".join(
    f"{i};{i / 3};{'NA' if i % 2 else i}\r\n".encode() for i in range(30)
)


@pytest.mark.parametrize(
    ("decoder", "data"),
    [pytest.param(JsonlDecoder, JSONL, id="jsonl"), pytest.param(CsvDecoder, CSV, id="csv")],
)
def test_snapshot_and_restore_mid_file_equal_a_continuous_read(
    decoder: Callable[[], Decoder], data: bytes
) -> None:
    whole = decoder().feed(data, at_eof=True, file_time=FILE_TIME)
    assert whole.errors == []
    middle = data.index(b"\n", len(data) // 2) + 1
    first = decoder()
    head = first.feed(data[:middle], at_eof=False, file_time=FILE_TIME)
    second = decoder()
    second.restore(json.loads(json.dumps(first.snapshot())))
    tail = second.feed(data[head.consumed :], at_eof=True, file_time=FILE_TIME)
    assert head.samples + tail.samples == whole.samples
