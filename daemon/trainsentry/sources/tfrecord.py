"""TFRecord framing: where records start and end, and which bytes to distrust.

An event file is a sequence of records `[u64 length][u32 crc(length)][data][u32 crc(data)]`,
both CRCs masked CRC-32C. The framer never raises and never guesses: a header
whose length CRC fails is corruption for certain, while a header that verifies
but whose data has not fully arrived is a record still being written and is
left unconsumed until it is complete. The length CRC is what makes resyncing
safe: a random 12-byte window verifies with probability 2^-32, so the first
offset after a corrupt region where a header verifies is, in practice, the next
real record.

A corrupt region is reported once however it is cut by reads: the framer stays
"resyncing" until the next good record, so garbage that straddles two reads (or
a daemon restart, since the flag is part of the decoder's snapshot) does not
produce a second error.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from crc32c import crc32c

from trainsentry.sources.base import MAX_RECORD_BYTES, DecodeError

HEADER_BYTES = 12
FOOTER_BYTES = 4
# A "verified" length beyond the record limit is a 1-in-2^32 coincidence in
# garbage, or a record too large to be one a job logs: either way it is skipped
# by resyncing on the next verified header, never waited for.

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
# A plausible length (< 2^32) has four zero high bytes; searching for them in C
# skips most garbage without a CRC call per byte.
_HIGH_ZEROS = b"\0\0\0\0"
_NONZERO = re.compile(rb"[^\0]")


def masked_crc32c(data: bytes | memoryview) -> int:
    """CRC-32C as TensorFlow stores it, rotated and offset so that CRCs of CRCs stay strong."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def encode_record(data: bytes) -> bytes:
    """One framed record; what TensorFlow's RecordWriter writes."""
    length = _LENGTH.pack(len(data))
    return length + _CRC.pack(masked_crc32c(length)) + data + _CRC.pack(masked_crc32c(data))


@dataclass(slots=True)
class Framed:
    """Records found in a buffer: `records` holds (offset of header, data) pairs."""

    consumed: int
    records: list[tuple[int, bytes]] = field(default_factory=list)
    errors: list[DecodeError] = field(default_factory=list)


def _refused_header(buf: bytes, pos: int) -> str:
    length, stored = _HEADER.unpack_from(buf, pos)
    if masked_crc32c(buf[pos : pos + 8]) == stored:  # a true header, of too large a record
        limit = MAX_RECORD_BYTES >> 20
        return f"a record of {length} bytes, over the {limit} MB record limit: skipped"
    return "record header fails its CRC"


class Framer:
    """Splits bytes into verified records, skipping and counting corrupt regions."""

    __slots__ = ("_lengths", "resyncing")

    def __init__(self) -> None:
        self.resyncing = False
        # Verified header bytes -> data length. Headers repeat (a run writes the
        # same few record sizes), so one dict lookup replaces a CRC per record.
        self._lengths: dict[bytes, int] = {}

    def header_length(self, buf: bytes, pos: int) -> int | None:
        """The data length announced by the complete header at `pos`, or None if it is corrupt."""
        header = buf[pos : pos + HEADER_BYTES]
        length = self._lengths.get(header)
        if length is not None:
            return length
        length, stored = _HEADER.unpack(header)
        if length > MAX_RECORD_BYTES or masked_crc32c(header[:8]) != stored:
            return None
        if len(self._lengths) >= 4096:
            self._lengths.clear()
        self._lengths[header] = length
        return length

    def next_record(self, buf: bytes, pos: int, errors: list[DecodeError]) -> tuple[int, int]:
        """Frame the first good record at or after `pos`.

        Returns `(start, end)` of its data (the next record begins at
        `end + FOOTER_BYTES`), or `(-1, resume)` when the bytes from `resume` on
        are an incomplete record (or may be the start of one) and must wait.
        Corrupt bytes skipped on the way are reported into `errors`.
        """
        size = len(buf)
        while size - pos >= HEADER_BYTES:
            length = self.header_length(buf, pos)
            if length is not None:
                start = pos + HEADER_BYTES
                end = start + length
                if end + FOOTER_BYTES > size:
                    return -1, pos
                if masked_crc32c(buf[start:end]) == _CRC.unpack_from(buf, end)[0]:
                    self.resyncing = False
                    return start, end
                # Not skipped whole: bytes lost or inserted inside the record would
                # put the next one somewhere other than where this length says.
                self._corrupt(pos, "record data fails its CRC", errors)
            else:
                self._corrupt(pos, _refused_header(buf, pos), errors)
            pos = self._scan(buf, pos + 1)
            if pos < 0:
                # Nothing verifies; the last bytes may still begin a header.
                return -1, size - HEADER_BYTES + 1
        return -1, pos

    def split(self, buf: bytes) -> Framed:
        """Every complete record in `buf`; the generic reader, used where speed is no concern.

        There is no `at_eof`: a trailing partial record waits even at the end of
        the file, because that end is only where the writer has got to so far.
        """
        framed = Framed(0)
        pos = 0
        while True:
            start, end = self.next_record(buf, pos, framed.errors)
            if start < 0:
                framed.consumed = end
                return framed
            framed.records.append((start - HEADER_BYTES, buf[start:end]))
            pos = end + FOOTER_BYTES

    def _corrupt(self, pos: int, message: str, errors: list[DecodeError]) -> None:
        if not self.resyncing:
            errors.append(DecodeError(pos, message))
            self.resyncing = True

    def _scan(self, buf: bytes, pos: int) -> int:
        """First offset >= pos where a record begins (header and complete data verify), or -1."""
        size = len(buf)
        while True:
            high = buf.find(_HIGH_ZEROS, pos + 4)
            if high < 0:
                return -1
            candidate = high - 4
            if candidate + HEADER_BYTES > size:
                return -1
            length = self.header_length(buf, candidate)
            if length is not None:
                end = candidate + HEADER_BYTES + length
                if (
                    end + FOOTER_BYTES > size
                    or masked_crc32c(buf[candidate + HEADER_BYTES : end])
                    == _CRC.unpack_from(buf, end)[0]
                ):
                    return candidate
            elif buf[candidate : candidate + HEADER_BYTES] == bytes(HEADER_BYTES):
                # Zero-filled runs (preallocated or crash-torn files) never verify:
                # an all-zero header has a nonzero CRC. Jump to the run's end.
                nonzero = _NONZERO.search(buf, candidate)
                if nonzero is None:
                    return -1
                pos = max(candidate + 1, nonzero.start() - HEADER_BYTES + 1)
                continue
            pos = candidate + 1
