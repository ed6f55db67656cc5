"""History records read from their bytes give exactly the rows protobuf's parse gives.

The byte reader (sources/wandb_history.py) must read what it reads as protobuf
would and hand everything else to protobuf: checked on a run the real `wandb`
wrote, and on records made by W&B's own generated classes with keys, values and
steps of every kind (long and non-ASCII keys, nested keys, `NaN`, `-0`, huge
integers, strings, typed values, fields after the history).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.trackers import expected

from trainsentry.point import Row
from trainsentry.sources.base import Decoded
from trainsentry.sources.wandb_history import HistoryBytes
from trainsentry.sources.wandb_records import _HISTORY, WandbDecoder

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def _rows(decoder: WandbDecoder, records: list[bytes], file_time: float = 7.0) -> list[Row]:
    out = Decoded(consumed=0)
    for record in records:
        decoder._record(out, record, 0, file_time)
    return out.rows


def _by_protobuf(monkeypatch: pytest.MonkeyPatch) -> WandbDecoder:
    """A decoder that reads every history record with protobuf, as before the byte reader."""
    decoder = WandbDecoder()
    monkeypatch.setattr(decoder._history, "items", lambda record, at: None)
    return decoder


def _same(a: list[Row], b: list[Row]) -> bool:
    return repr(a) == repr(b)  # repr: NaN equals NaN, and -0.0 is not 0.0


def test_a_real_runs_rows_are_read_from_bytes_as_protobuf_reads_them(
    tracker_stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tracker_stores["wandb"]
    (found,) = Path(expected(directory)["run_dir"]).glob("run-*.wandb")
    data = found.read_bytes()
    read = WandbDecoder()
    taken = 0
    items = read._history.items

    def counted(record: bytes, at: int) -> object:
        nonlocal taken
        got = items(record, at)
        taken += got is not None
        return got

    monkeypatch.setattr(read._history, "items", counted)
    rows = read.feed(data, at_eof=True, file_time=3.0).rows
    assert len(rows) == 260 and taken == 260  # every history record read from its bytes
    assert any(math.isnan(v) for r in rows for v in r.values)  # the diverged run's NaN
    parsed = _by_protobuf(monkeypatch).feed(data, at_eof=True, file_time=3.0).rows
    assert _same(rows, parsed)


_KEYS = st.one_of(
    st.sampled_from(["loss", "train/loss", "_step", "_timestamp", "_runtime", "_wandb", "lr"]),
    st.text(min_size=0, max_size=12),  # non-ASCII: bytes 0x80-0xff in the key, 0x82 too
    st.text(alphabet="ab€", min_size=120, max_size=140),  # a key's length in two bytes
)
_JSON = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "NaN",
            "Infinity",
            "-Infinity",
            "-0",
            "-0.0",
            "0",
            "1e400",
            "-1e-400",
            "1.",
            ".5",
            "+1",
            "01",
            "1_0",
            "nan",
            "inf",
            " 1",
            "1e",
            "e",
            "",
            '"text"',
            "true",
            "null",
            "[1,2]",
            "1,2",
            "{}",
        ]
    ),
    st.text(alphabet="0123456789.eE+-NaIfinty", max_size=140),
)


@st.composite
def _item(draw: st.DrawFn) -> object:
    item = pb.HistoryItem()
    key = draw(_KEYS)
    if draw(st.booleans()):
        item.key = key
    else:
        item.nested_key.extend(draw(st.lists(_KEYS, min_size=1, max_size=2)) if draw(
            st.integers(0, 3)) == 0 else [key])  # fmt: skip
    kind = draw(st.sampled_from(["json", "json", "json", "number", "integer", "none"]))
    if kind == "json":
        item.value_json = draw(_JSON)
    elif kind == "number":
        item.number = draw(st.floats(allow_nan=True))
    elif kind == "integer":
        item.integer = draw(st.integers(min_value=-(2**63), max_value=2**63 - 1))
    return item


@st.composite
def _record(draw: st.DrawFn) -> bytes:
    record = pb.Record(num=draw(st.integers(min_value=0, max_value=2**40)))
    record.history.SetInParent()
    record.history.item.extend(draw(st.lists(_item(), max_size=8)))
    step = draw(st.sampled_from(["none", "empty", "small", "any"]))
    if step == "empty":
        record.history.step.SetInParent()
    elif step == "small":
        record.history.step.num = draw(st.integers(min_value=0, max_value=127))
    elif step == "any":
        record.history.step.num = draw(st.integers(min_value=-(2**63), max_value=2**63 - 1))
    if draw(st.integers(0, 9)) == 0:
        record._info.stream_id = "x"  # a field after the history
    data: bytes = record.SerializeToString()
    return data


@settings(max_examples=400, deadline=None)
@given(st.lists(_record(), min_size=1, max_size=6))
def test_any_history_record_gives_the_row_protobuf_gives(records: list[bytes]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _same(_rows(WandbDecoder(), records), _rows(_by_protobuf(monkeypatch), records))


@st.composite
def _plain_record(draw: st.DrawFn) -> bytes:
    """A record as wandb-core writes `wandb.log` of numbers: what must take the byte path."""
    record = pb.Record(num=draw(st.integers(min_value=1, max_value=2**30)))
    keys = draw(st.lists(st.sampled_from(["a", "train/loss", "_step", "_timestamp", "é"]),
                         min_size=1, max_size=6))  # fmt: skip
    for key in keys:
        value = draw(st.one_of(st.floats(allow_nan=True).map(repr),
                               st.integers(-(2**60), 2**60).map(str)))  # fmt: skip
        value = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(value, value)
        record.history.item.add(nested_key=[key], value_json=value)
    if draw(st.booleans()):
        record.history.step.num = draw(st.integers(min_value=0, max_value=2**40))
    data: bytes = record.SerializeToString()
    return data


@settings(max_examples=200, deadline=None)
@given(_plain_record())
def test_a_plain_history_record_is_read_from_its_bytes(record: bytes) -> None:
    history = HistoryBytes(WandbDecoder()._plans)
    head = _HISTORY.match(record)  # the num, the history's tag
    assert head is not None and history.items(record, head.end()) is not None
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _same(_rows(WandbDecoder(), [record]), _rows(_by_protobuf(monkeypatch), [record]))


def test_a_value_shorter_than_its_characters_is_read_as_protobuf_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An item whose lengths say a value ends a character early (a writer's bug the CRC
    cannot see): protobuf reads the shorter value and the character after it as a field
    of the history, so the byte reader must not read the longer one."""
    record = pb.Record(num=5)
    record.history.item.add(nested_key=["loss"], value_json="1.25")
    record.history.item.add(nested_key=["lr"], value_json="0.5")
    data = record.SerializeToString()
    framing = b"\n\r\x12\x04loss\x82\x01\x04"
    assert framing in data
    at = data.index(framing)
    shorter = bytearray(data)
    shorter[at + 1] -= 1  # the item's length
    shorter[at + len(framing) - 1] -= 1  # the value's length: "1.2", then "5" as a tag
    got = _rows(WandbDecoder(), [bytes(shorter)])
    assert _same(got, _rows(_by_protobuf(monkeypatch), [bytes(shorter)]))
    assert not any(1.25 in r.values for r in got)


@settings(max_examples=300, deadline=None)
@given(_plain_record(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                 min_size=1, max_size=3))  # fmt: skip
def test_a_damaged_record_gives_what_protobuf_gives(
    record: bytes, changes: list[tuple[int, int]]
) -> None:
    damaged = bytearray(record)
    for at, byte in changes:
        damaged[at % len(damaged)] = byte
    decoded = [WandbDecoder() for _ in range(2)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(decoded[1]._history, "items", lambda record, at: None)
        outs = [Decoded(consumed=0) for _ in decoded]
        for decoder, out in zip(decoded, outs, strict=True):
            decoder._record(out, bytes(damaged), 0, 7.0)
    assert _same(outs[0].rows, outs[1].rows)
    assert [e.message for e in outs[0].errors] == [e.message for e in outs[1].errors]
