"""TFRecord framing on hand-made bytes: the only way to get exactly the corruption we want.

Whole event files from real writers are in test_tfevents.py; here the records
are arbitrary payloads so that every framing case (partial, corrupt, resync)
can be placed at a chosen byte.
"""

from __future__ import annotations

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.sources.tfrecord import (
    HEADER_BYTES,
    MAX_RECORD_BYTES,
    Framer,
    encode_record,
    masked_crc32c,
)

PAYLOADS = [b"first", b"", b"x" * 300, bytes(range(256)), b"\0" * 40, b"last one"]


def stream(payloads: list[bytes]) -> tuple[bytes, list[int]]:
    """The framed records and the offset of each."""
    offsets, out = [], b""
    for payload in payloads:
        offsets.append(len(out))
        out += encode_record(payload)
    return out, offsets


def tail(chunks: list[bytes], framer: Framer | None = None) -> tuple[list[bytes], list[int]]:
    """Feed chunks the way the tailer does: unconsumed bytes are handed again, longer.

    Returns the records and the absolute offsets of the errors.
    """
    framer = framer or Framer()
    records: list[bytes] = []
    errors: list[int] = []
    pending, base = b"", 0
    for chunk in chunks:
        pending += chunk
        framed = framer.split(pending)
        records += [data for _, data in framed.records]
        errors += [base + e.offset for e in framed.errors]
        base += framed.consumed
        pending = pending[framed.consumed :]
    return records, errors


def test_records_are_read_back_with_their_offsets() -> None:
    buf, offsets = stream(PAYLOADS)
    framed = Framer().split(buf)
    assert framed.records == list(zip(offsets, PAYLOADS, strict=True))
    assert framed.consumed == len(buf)
    assert framed.errors == []


def test_masked_crc_matches_tensorflow() -> None:
    # Known value: TensorFlow's masked CRC of an empty string (record_writer tests).
    assert masked_crc32c(b"") == 0xA282EAD8
    assert encode_record(b"")[8:12] == struct.pack("<I", masked_crc32c(struct.pack("<Q", 0)))


def test_zero_length_record_is_a_record() -> None:
    framed = Framer().split(encode_record(b""))
    assert framed.records == [(0, b"")]


def test_partial_record_is_read_once_complete() -> None:
    buf, offsets = stream(PAYLOADS)
    ends = [o + len(encode_record(p)) for o, p in zip(offsets, PAYLOADS, strict=True)]
    for cut in range(len(buf) + 1):
        framed = Framer().split(buf[:cut])
        complete = [p for p, end in zip(PAYLOADS, ends, strict=True) if end <= cut]
        assert [data for _, data in framed.records] == complete
        assert framed.consumed == max([0] + [e for e in ends if e <= cut])
        assert framed.errors == []


def test_every_record_arrives_exactly_once_when_fed_byte_by_byte() -> None:
    buf, _ = stream(PAYLOADS)
    records, errors = tail([buf[i : i + 1] for i in range(len(buf))])
    assert records == PAYLOADS
    assert errors == []


def test_bad_length_crc_skips_the_record_and_counts_it_once() -> None:
    buf, offsets = stream(PAYLOADS)
    broken = bytearray(buf)
    broken[offsets[2] + 9] ^= 0xFF
    framed = Framer().split(bytes(broken))
    assert [data for _, data in framed.records] == PAYLOADS[:2] + PAYLOADS[3:]
    assert [e.offset for e in framed.errors] == [offsets[2]]


def test_flipped_length_is_skipped_and_the_rest_still_read() -> None:
    buf, offsets = stream(PAYLOADS)
    broken = bytearray(buf)
    broken[offsets[3]] ^= 0x01
    framed = Framer().split(bytes(broken))
    assert [data for _, data in framed.records] == PAYLOADS[:3] + PAYLOADS[4:]
    assert [e.offset for e in framed.errors] == [offsets[3]]


def test_bad_data_crc_loses_only_that_record() -> None:
    buf, offsets = stream(PAYLOADS)
    broken = bytearray(buf)
    broken[offsets[2] + HEADER_BYTES + 7] ^= 0x20
    framed = Framer().split(bytes(broken))
    assert [data for _, data in framed.records] == PAYLOADS[:2] + PAYLOADS[3:]
    assert [e.offset for e in framed.errors] == [offsets[2]]


def test_garbage_between_records_is_skipped_and_counted_once() -> None:
    buf, offsets = stream(PAYLOADS)
    garbage = random.Random(7).randbytes(1000)
    broken = buf[: offsets[4]] + garbage + buf[offsets[4] :]
    framed = Framer().split(broken)
    assert [data for _, data in framed.records] == PAYLOADS
    assert [e.offset for e in framed.errors] == [offsets[4]]


def test_garbage_inside_a_record_loses_only_that_record() -> None:
    buf, offsets = stream(PAYLOADS)
    at = offsets[2] + HEADER_BYTES + 100
    framed = Framer().split(buf[:at] + b"\x13\x37" * 50 + buf[at:])
    assert [data for _, data in framed.records] == PAYLOADS[:2] + PAYLOADS[3:]
    assert [e.offset for e in framed.errors] == [offsets[2]]


def test_absurd_length_with_a_valid_crc_is_corruption() -> None:
    length = struct.pack("<Q", MAX_RECORD_BYTES + 1)
    header = length + struct.pack("<I", masked_crc32c(length))
    buf, _ = stream(PAYLOADS[:2])
    framed = Framer().split(header + buf)
    assert [data for _, data in framed.records] == PAYLOADS[:2]
    assert [e.offset for e in framed.errors] == [0]


def test_zero_filled_region_is_skipped_and_counted_once() -> None:
    buf, offsets = stream(PAYLOADS)
    broken = buf[: offsets[1]] + bytes(64 * 1024) + buf[offsets[1] :]
    framed = Framer().split(broken)
    assert [data for _, data in framed.records] == PAYLOADS
    assert [e.offset for e in framed.errors] == [offsets[1]]


def test_corrupt_region_cut_by_reads_is_reported_once() -> None:
    buf, offsets = stream(PAYLOADS)
    garbage = random.Random(3).randbytes(5000)
    whole = buf[: offsets[3]] + garbage + buf[offsets[3] :]
    chunks = [whole[i : i + 700] for i in range(0, len(whole), 700)]
    records, errors = tail(chunks)
    assert records == PAYLOADS
    assert errors == [offsets[3]]


def test_bytes_after_garbage_wait_for_the_rest_of_their_record() -> None:
    garbage = random.Random(5).randbytes(200)
    record = encode_record(b"written late")
    framer = Framer()
    first = framer.split(garbage + record[:7])
    assert first.records == []
    assert len(first.errors) == 1
    pending = (garbage + record[:7])[first.consumed :]
    second = framer.split(pending + record[7:])
    assert [data for _, data in second.records] == [b"written late"]
    assert second.errors == []  # still the same corrupt region


def test_a_new_corrupt_region_after_a_good_record_is_counted_again() -> None:
    buf, offsets = stream(PAYLOADS)
    broken = bytearray(buf)
    broken[offsets[1] + 2] ^= 0xFF
    broken[offsets[4] + 2] ^= 0xFF
    framed = Framer().split(bytes(broken))
    assert [e.offset for e in framed.errors] == [offsets[1], offsets[4]]
    assert len(framed.records) == len(PAYLOADS) - 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_raise(data: bytes) -> None:
    framed = Framer().split(data)
    assert 0 <= framed.consumed <= len(data)
    for offset, record in framed.records:
        assert data[offset + HEADER_BYTES : offset + HEADER_BYTES + len(record)] == record


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=120), min_size=1, max_size=12),
    st.data(),
)
def test_one_mutation_loses_at_most_the_record_it_hits(
    payloads: list[bytes], data: st.DataObject
) -> None:
    buf, offsets = stream(payloads)
    at = data.draw(st.integers(0, len(buf) - 1), label="at")
    kind = data.draw(st.sampled_from(["flip", "insert", "delete"]), label="kind")
    if kind == "flip":
        mutated = buf[:at] + bytes([buf[at] ^ data.draw(st.integers(1, 255))]) + buf[at + 1 :]
    elif kind == "insert":
        mutated = buf[:at] + data.draw(st.binary(min_size=1, max_size=40)) + buf[at:]
    else:
        mutated = buf[:at] + buf[at + 1 :]
    hit = max(i for i, o in enumerate(offsets) if o <= at)
    split = data.draw(st.integers(0, len(mutated)), label="split")
    records, errors = tail([mutated[:split], mutated[split:]])
    survivors = payloads[:hit] + payloads[hit + 1 :]
    assert all(p in records for p in survivors)
    assert len(records) <= len(payloads) + 1  # an inserted blob may itself be a record
    assert len(errors) <= 2
