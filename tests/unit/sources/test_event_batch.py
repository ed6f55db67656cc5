"""Event files long enough to be decoded a group at a time (event_batch.py).

The group path must change speed, never results: every file here is read three
ways (the group path, record by record with groups turned off, and tbparse) and
the points must be the same, in the same order, with the same stamps. Files are
written by the real writers, long enough for runs of one record length, tags of
several lengths interleaved, and steps whose varint grows inside a run.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from tbparse import SummaryReader
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from trainsentry.point import Sample
from trainsentry.sources import event_batch, tfevents
from trainsentry.sources.tfevents import TfEventsDecoder
from trainsentry.sources.tfrecord import Framer

FILE_TIME = 1234.5

VALUES = [0.5, -1.25, 0.0, math.nan, math.inf, -math.inf, 3.0e38, 1e-30, 7.0, -0.0]
# Runs that cross the varint's 1/2, 2/3 and 3/4 byte limits, long steps, and a
# negative one (ten bytes: never taken by a group).
STEPS = [
    *range(0, 300),
    *range(16_300, 16_450),
    *range(2_097_100, 2_097_200),
    *range(300_000_000, 300_000_080),
    *range(10**12, 10**12 + 40),
    -5,
    *range(300, 400),
]
SAME_LENGTH = [f"train/metric_{t}" for t in range(10)]
MIXED = ["loss", "lr", "train/grad_norm", "métrique/ü", "val/loss"]


def event_file(directory: Path) -> Path:
    (path,) = sorted(directory.rglob("*tfevents*"))
    return path


def torch_file(directory: Path, tags: list[str], **kwargs: Any) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory), max_queue=10_000)
    for i, step in enumerate(STEPS):
        for t, tag in enumerate(tags):
            writer.add_scalar(tag, VALUES[(i + t) % len(VALUES)], step, **kwargs)
    writer.close()
    return event_file(directory)


def torch_cadences_file(directory: Path) -> Path:
    """Tags logged every step, every 3rd and every 7th: no cycle short enough to find."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory), max_queue=10_000)
    for i, step in enumerate(STEPS):
        for t, (tag, every) in enumerate([("loss", 1), ("lr", 3), ("val/accuracy", 7)]):
            if i % every == 0:
                writer.add_scalar(tag, VALUES[(i + t) % len(VALUES)], step)
    writer.close()
    return event_file(directory)


def tf2_file(directory: Path, tags: list[str]) -> Path:
    writer = EventFileWriter(str(directory), max_queue_size=10_000)
    for i, step in enumerate(STEPS):
        now = time.time()
        for t, tag in enumerate(tags):
            summary = scalar_pb(tag, VALUES[(i + t) % len(VALUES)])
            writer.add_event(event_pb2.Event(wall_time=now, step=step, summary=summary))
    writer.close()
    return event_file(directory)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = tmp_path_factory.mktemp
    return {
        "torch_same_length": torch_file(made("torch_same"), SAME_LENGTH),
        "torch_mixed": torch_file(made("torch_mixed"), MIXED),
        "torch_new_style_double": torch_file(
            made("torch_f64"), MIXED, new_style=True, double_precision=True
        ),
        "torch_cadences": torch_cadences_file(made("torch_cadences")),
        "tf2_same_length": tf2_file(made("tf2_same"), SAME_LENGTH),
        "tf2_mixed": tf2_file(made("tf2_mixed"), MIXED),
    }


def as_read(rows: Any) -> list[tuple[str, int, str]]:
    """(tag, step, value) sorted, the value as a float64's hex so NaN equals NaN."""
    return sorted((tag, int(step), float(value).hex()) for tag, step, value in rows)


def tbparse(directory: Path, kind: str) -> list[tuple[str, int, str]]:
    frame = getattr(SummaryReader(str(directory), event_types={kind}), kind)
    return as_read(zip(frame["tag"], frame["step"], frame["value"], strict=True))


def feed(data: bytes, groups: bool, monkeypatch: pytest.MonkeyPatch) -> tfevents.Decoded:
    with monkeypatch.context() as patch:
        if not groups:
            patch.setattr(tfevents, "MIN_GROUP", 10**9)
        return TfEventsDecoder().feed(data, at_eof=True, file_time=FILE_TIME)


def exact(samples: list[Sample]) -> list[tuple[Any, ...]]:
    """Every field, NaN equal to NaN, -0.0 apart from 0.0, ints apart from floats."""

    def norm(x: Any) -> Any:
        return ("float", x.hex()) if isinstance(x, float) else (type(x).__name__, x)

    return [tuple(norm(x) for x in s) for s in samples]


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each group call decoded, so a test knows the path was taken."""
    counts: list[int] = []
    decode = event_batch.Group.decode

    def spy(self: event_batch.Group, *args: Any) -> Any:
        result = decode(self, *args)
        counts.append(len(result[1][0]))
        return result

    monkeypatch.setattr(event_batch.Group, "decode", spy)
    return counts


@pytest.mark.parametrize(
    "name",
    [
        "torch_same_length",  # runs of one length, read in place
        "torch_mixed",  # tags of several lengths in turn: a cycle, read in place
        "torch_new_style_double",
        "torch_cadences",  # no cycle: framed one by one, grouped by length
        "tf2_same_length",
        "tf2_mixed",
    ],
)
def test_groups_read_what_tbparse_and_the_record_path_read(
    name: str, files: dict[str, Path], taken: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = files[name].read_bytes()
    grouped = feed(data, True, monkeypatch)
    one_by_one = feed(data, False, monkeypatch)
    assert grouped.errors == one_by_one.errors == []
    assert grouped.consumed == len(data)
    assert exact(grouped.samples) == exact(one_by_one.samples)
    kind = "scalars" if name.startswith("torch") and "new_style" not in name else "tensors"
    assert as_read((s.tag, s.step, s.value) for s in grouped.samples) == tbparse(
        files[name].parent, kind
    )
    assert sum(taken) > len(grouped.samples) * 0.8  # the group path read them


def records_of(path: Path) -> list[tuple[int, bytes]]:
    return Framer().split(path.read_bytes()).records


# Where a byte is flipped inside a record in the middle of a long run: the data CRC
# must catch each, whether the group or the record path reads that record.
PLACES = {"wall time": 3, "step": 10, "tag": 20, "value": -2, "stored crc": None}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("name", ["torch_same_length", "tf2_mixed"])
def test_a_flipped_byte_anywhere_in_a_group_is_one_error_and_the_rest_is_read(
    name: str, place: str, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = files[name].read_bytes()
    records = records_of(files[name])
    offset, payload = records[len(records) // 2]
    at = PLACES[place]
    index = offset + 12 + len(payload) if at is None else offset + 12 + at % len(payload)
    broken = bytearray(data)
    broken[index] ^= 0x10
    decoded = feed(bytes(broken), True, monkeypatch)
    assert [e.offset for e in decoded.errors] == [offset]
    clean = feed(data, True, monkeypatch).samples
    lost = feed(data[offset : offset + 16 + len(payload)], False, monkeypatch).samples
    assert len(lost) == 1
    expected = list(clean)
    expected.remove(lost[0])
    assert exact(decoded.samples) == exact(expected)
    assert decoded.consumed == len(data)


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_a_growing_file_cut_anywhere_reads_every_point_once(
    files: dict[str, Path], data: st.DataObject
) -> None:
    """A partial record at the end of a read waits for the next, inside a group too."""
    name = data.draw(st.sampled_from(sorted(files)), label="file")
    whole = files[name].read_bytes()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=4), label="cuts"))
    decoder = TfEventsDecoder()
    samples: list[Sample] = []
    pending, read = b"", 0
    for cut in [*cuts, len(whole)]:
        pending += whole[read:cut]
        read = max(read, cut)
        decoded = decoder.feed(pending, at_eof=True, file_time=FILE_TIME)
        assert decoded.errors == []
        samples += decoded.samples
        pending = pending[decoded.consumed :]
    assert pending == b""
    expected = TfEventsDecoder().feed(whole, at_eof=True, file_time=FILE_TIME).samples
    assert exact(samples) == exact(expected)


def _bare_tensor(step: int, tag: str, value: float, metadata: Any = None) -> event_pb2.Event:
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
    summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
    return event_pb2.Event(
        wall_time=1e9 + step, step=step, summary=summary_pb2.Summary(value=[summary_value])
    )


def test_a_plugin_learnt_inside_a_group_stops_the_rows_made_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bare rank-0 tensors of a tag with no plugin are scalars, until the tag's plugin is
    learnt; the group's rows already made for the tag's later records must not stand."""
    text = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
    )
    events = [_bare_tensor(step, "t", float(step)) for step in range(1, 300)]
    events.insert(200, _bare_tensor(200, "t", 0.5, text))
    # The same record length seen before, so that the group frames the record that
    # teaches the plugin along with those after it.
    events.insert(0, _bare_tensor(200, "u", 0.5, text))
    writer = EventFileWriter(str(tmp_path))
    for event in events:
        writer.add_event(event)
    writer.close()
    data = event_file(tmp_path).read_bytes()
    grouped = feed(data, True, monkeypatch)
    assert exact(grouped.samples) == exact(feed(data, False, monkeypatch).samples)
    assert [s.step for s in grouped.samples] == list(range(1, 201))  # its last bare one


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=1, max_size=256))
def test_the_crc_by_table_is_crc32c(message: bytes) -> None:
    table, zero = event_batch._crc_table(len(message))
    crc = zero
    for p, byte in enumerate(message):
        crc ^= int(table[p, byte])
    assert crc == crc32c(message)
