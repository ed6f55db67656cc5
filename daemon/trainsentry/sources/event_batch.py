"""Templated event records decoded a group at a time, with numpy.

A backfill reads hundreds of thousands of records that differ from one another
only in their wall time, step and value: same header, same tag bytes, same
trailing metadata. Decoded one by one, each costs about ten C calls from Python
(slice, unpack, CRC, lookup, ...), a µs a record; the Rust data server spends
half that. Here records of one length are stacked as the rows of a 2-D byte
array and every check and field is one numpy operation over the group:

- the protobuf layout: wall time (field 1) and step (field 2) first, the step's
  varint of 1 to 9 bytes, then the bytes between step and value and those after
  the value compared, every one of them, with one of the decoder's templates
  (`_Matcher`: a hash finds the candidate, then the bytes are compared);
- the data CRC (CRC-32C, masked) of every record. For messages of one length
  the CRC is affine in the message bits: crc(m) = crc(0ⁿ) ^ XOR_p T_p[m[p]], with
  T_p[b] the CRC of byte b at position p (`_crc_table`). The bytes a matched
  record shares with its template contribute a constant, computed once per
  template, so a record costs one table entry per byte of its wall time, step
  and value; the result is the record's CRC, exactly what `crc32c` computes.

A record that fails any check is not judged here: the caller decodes it alone,
by the path every record took before (which reports a corrupt one), so this
changes speed, never results.
"""

from __future__ import annotations

import importlib
import os
import struct
import sys
from collections.abc import Sequence
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

from crc32c import crc32c

from trainsentry.sources.tfrecord import FOOTER_BYTES, HEADER_BYTES


def _numpy_without_blas_threads() -> Any:
    """numpy, its OpenBLAS started with one thread where this process loads it first.

    Nothing here calls BLAS, but numpy's import does (a sanity check), and OpenBLAS's
    worker threads then spin for ~0.06 CPU-s: a tenth of reading 100,000 points. The
    setting is read when the library loads, so it is set only around the import:
    processes the daemon starts later inherit the user's environment unchanged.
    """
    name = "OPENBLAS_NUM_THREADS"
    if "numpy" in sys.modules or name in os.environ:
        return importlib.import_module("numpy")
    os.environ[name] = "1"
    try:
        return importlib.import_module("numpy")
    finally:
        del os.environ[name]


if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy_without_blas_threads()

# CRC tables and matchers kept: a run writes a few record lengths; more are
# made again when next needed (a few ms each), never kept without bound.
_MAX_TABLES = 32
_MAX_MATCHERS = 256
_LENGTH = struct.Struct("<Q")  # a record header's first field
_MASK_DELTA = np.uint32(0xA282EAD8)
_WALL, _STEP = 1, 10  # where wall time and step begin in a templated record's data
_HASH = np.array(  # odd 64-bit multipliers, one per 8 bytes of a template key
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93] * 16,
    dtype=np.uint64,
)

Fields = list[list[Any]]  # steps, wall times, tags, values: one entry per record taken


def rows_equal(block: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Which rows of a (records, width) byte array equal `pattern`, compared as words."""
    words, ref = _words([block]), _words([pattern[None, :]])[0]
    equal: np.ndarray = words[:, 0] == ref[0]
    for i in range(1, len(ref)):
        equal &= words[:, i] == ref[i]
    return equal


def _words(parts: list[np.ndarray]) -> np.ndarray:
    """Byte columns side by side as uint64 words, zero-padded: equal words, equal bytes."""
    count = len(parts[0])
    width = sum(p.shape[1] for p in parts)
    padded = np.zeros((count, -(-width // 8) * 8), dtype=np.uint8)
    at = 0
    for part in parts:
        padded[:, at : at + part.shape[1]] = part
        at += part.shape[1]
    return padded.view(np.uint64)


def _crc_table(n: int) -> tuple[np.ndarray, int]:
    """T[p, b] for messages of n bytes (see the module's docstring), and crc(0ⁿ)."""
    zero = crc32c(bytes(n))
    message = bytearray(n)
    single = np.empty((n, 8), dtype=np.uint32)
    for p in range(n):
        for bit in range(8):
            message[p] = 1 << bit
            single[p, bit] = crc32c(message) ^ zero
        message[p] = 0
    bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # (256, 8)
    chosen = np.where(bits[None, :, :], single[:, None, :], np.uint32(0))
    return np.bitwise_xor.reduce(chosen, axis=2).astype(np.uint32), zero


class _Matcher:
    """The templates of one record layout (length, step width, value offset and tail),
    as words to compare and as the CRC their bytes contribute."""

    __slots__ = ("_hashes", "_order", "_words", "constants", "tags")

    def __init__(
        self, table: dict[bytes, tuple[str, ...]], crc: tuple[np.ndarray, int], layout: _Layout
    ) -> None:
        start, cut, size, tail, _ = layout
        found = [(k, v) for k, v in table.items() if len(k) == cut - start]
        self.tags = np.empty(len(found), dtype=object)
        for i, (_, tags) in enumerate(found):
            self.tags[i] = tags
        keys = np.frombuffer(b"".join(k for k, _ in found), dtype=np.uint8)
        keys = keys.reshape(len(found), cut - start)
        tails = np.broadcast_to(np.frombuffer(tail, dtype=np.uint8), (len(found), len(tail)))
        self._words = _words([keys, tails])
        hashes = _hash(self._words)
        self._order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[self._order]
        if len(found) and np.any(self._hashes[1:] == self._hashes[:-1]):
            self._hashes = self._hashes[:0]  # two keys of one hash (2^-64): match nothing
        table_, zero = crc
        fixed = zero ^ int(table_[0, 9]) ^ int(table_[_STEP - 1, 16])  # the two field keys
        for i, b in enumerate(tail):
            fixed ^= int(table_[cut + size + i, b])
        spread = table_[np.arange(start, cut), keys] if len(found) else np.zeros((0, 1), np.uint32)
        self.constants = np.bitwise_xor.reduce(spread, axis=1) ^ np.uint32(fixed)

    def match(self, words: np.ndarray) -> np.ndarray:
        """Each row's template, -1 where its bytes are no template's."""
        if not len(self._hashes):
            return np.full(len(words), -1, dtype=np.intp)
        hashes = _hash(words)
        at = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
        index = self._order[at]
        same = self._hashes[at] == hashes
        mine = np.take(self._words, index, axis=0)
        for i in range(words.shape[1]):
            same &= mine[:, i] == words[:, i]
        found: np.ndarray = np.where(same, index, -1)
        return found


# key start (after the step), value offset, value size, bytes after the value, data length
_Layout = tuple[int, int, int, bytes, int]


def _hash(words: np.ndarray) -> np.ndarray:
    hashed: np.ndarray = words[:, 0] * _HASH[0]
    for i in range(1, words.shape[1]):
        hashed ^= words[:, i] * _HASH[i]
        hashed ^= hashed >> np.uint64(29)
    return hashed


class Group:
    """Decodes groups of same-length records against one frame's guessed shape."""

    __slots__ = ("_crcs", "_matchers")

    def __init__(self) -> None:
        self._crcs: dict[int, tuple[np.ndarray, int]] = {}
        self._matchers: dict[tuple[int, _Layout], tuple[int, _Matcher]] = {}

    def repeats(self, buf: bytes, pos: int, heads: Sequence[bytes], count: int) -> int:
        """How many times, of `count`, the records whose headers are `heads` (so their
        lengths) follow one another from `pos` in this order, before the first
        time they do not: one header for a run of records of one length, a step's
        tags' for a writer that logs tags of several lengths in turn."""
        lengths = [_LENGTH.unpack_from(head)[0] + HEADER_BYTES + FOOTER_BYTES for head in heads]
        cycle = sum(lengths)
        block = np.frombuffer(buf, dtype=np.uint8, count=count * cycle, offset=pos)
        rows = block.reshape(count, cycle)
        same = np.ones(count, dtype=bool)
        at = 0
        for head, length in zip(heads, lengths, strict=True):
            same &= rows_equal(rows[:, at : at + HEADER_BYTES], np.frombuffer(head, np.uint8))
            at += length
        return count if same.all() else int(same.argmin())

    def decode(
        self,
        buf: bytes,
        starts: Sequence[int],
        total: int,
        cut: int,
        value_format: str,
        tail: bytes,
        table: dict[bytes, tuple[str, ...]],
        edits: int,
    ) -> tuple[list[int] | None, Fields]:
        """Which of the records at `starts` (all `total` bytes long, header included) are
        templated records: their indices in `starts` (None: all of them), and their
        steps, wall times, tags and values.

        `cut` is the value's offset in the record's data, as in the decoder's frame;
        `edits` counts the changes to the decoder's template tables.
        """
        count = len(starts)
        whole = np.frombuffer(buf, dtype=np.uint8)
        if isinstance(starts, range) and starts.step >= total:  # records at a fixed stride
            span = whole[starts.start : starts.start + (count - 1) * starts.step + total]
            block = np.lib.stride_tricks.as_strided(
                span, (count, total), (starts.step, 1), writeable=False
            )
        else:
            block = whole[np.asarray(starts)[:, None] + np.arange(total)]
        ok = self._templated(block, cut, value_format, tail, table, edits)
        if ok is None or not ok[0].any():
            return [], [[], [], [], []]
        ok_rows, steps, wall, found, pool = ok
        length = total - HEADER_BYTES - FOOTER_BYTES
        data = block[:, HEADER_BYTES : HEADER_BYTES + length]
        size = 4 if value_format == "<f" else 8
        value = np.ascontiguousarray(data[:, cut : cut + size]).view(value_format)[:, 0]
        every = bool(ok_rows.all())
        taken: Any = slice(None) if every else ok_rows
        return None if every else np.flatnonzero(ok_rows).tolist(), [
            _shared(steps[taken].astype(np.int64)),
            _shared(wall[taken]),
            pool[found[taken]].tolist(),
            value[taken].tolist(),
        ]

    def _templated(
        self,
        block: np.ndarray,
        cut: int,
        value_format: str,
        tail: bytes,
        table: dict[bytes, tuple[str, ...]],
        edits: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Which rows are templated records whose CRC verifies, and their steps, wall
        times, template indices and the templates' tags; None when none can be."""
        count, total = block.shape
        length = total - HEADER_BYTES - FOOTER_BYTES
        span = min(9, cut - _STEP - 1)  # the step's bytes leave a key of one byte at least
        if span < 1:
            return None
        data = block[:, HEADER_BYTES : HEADER_BYTES + length]
        size = 4 if value_format == "<f" else 8
        # The step varint's length: one more than its bytes with the high bit set.
        first = _step_width(data[0, _STEP : _STEP + span].tolist())
        uniform = bool(first) and _all_width(data, first)
        widths: Any = first
        if not uniform:  # a run across a varint's limit, or lengths that coincide
            more = data[:, _STEP : _STEP + span] >= 128
            widths = np.where(more.all(axis=1), 0, more.argmin(axis=1) + 1)
        found = np.full(count, -1, dtype=np.intp)
        constants = np.zeros(count, dtype=np.uint32)
        steps = np.zeros(count, dtype=np.uint64)
        pools: list[np.ndarray] = []
        crc = self._crc(length)
        for width in [first] if uniform else np.unique(widths).tolist():
            if not width:
                continue  # a step of ten bytes or more: one by one
            rows: Any = slice(None) if uniform else np.flatnonzero(widths == width)
            start = _STEP + width
            matcher = self._matcher(table, crc, (start, cut, size, tail, length), edits)
            if not len(matcher.tags):
                continue
            part = data[rows]
            index = matcher.match(_words([part[:, start:cut], part[:, cut + size :]]))
            offset = sum(len(p) for p in pools)
            found[rows] = np.where(index >= 0, index + offset, -1)
            constants[rows] = np.take(matcher.constants, index)  # garbage where -1: not taken
            pools.append(matcher.tags)
            step = (part[:, _STEP] & np.uint8(127)).astype(np.uint64)
            for i in range(1, width):
                step |= (part[:, _STEP + i] & np.uint8(127)).astype(np.uint64) << np.uint64(7 * i)
            steps[rows] = step
        if not pools:
            return None
        ok = found >= 0
        ok &= (data[:, 0] == 9) & (data[:, _STEP - 1] == 16)  # wall_time, then step
        wall = np.ascontiguousarray(data[:, _WALL : _STEP - 1]).view("<f8")[:, 0]
        ok &= wall != 0  # no stamp: the file's time, decided one by one
        # CRC: the template's constant, and the bytes of wall time, step and value.
        table_ = crc[0]
        computed = constants
        for p in range(_WALL, _STEP - 1):
            computed ^= np.take(table_[p], data[:, p])
        for p in range(_STEP, _STEP + (first if uniform else span)):
            mine = np.take(table_[p], data[:, p])
            computed ^= mine if uniform else np.where(widths > p - _STEP, mine, np.uint32(0))
        for p in range(cut, cut + size):
            computed ^= np.take(table_[p], data[:, p])
        masked = ((computed >> np.uint32(15)) | (computed << np.uint32(17))) + _MASK_DELTA
        stored = np.ascontiguousarray(block[:, HEADER_BYTES + length :]).view("<u4")[:, 0]
        ok &= masked == stored
        pool = np.concatenate(pools) if len(pools) > 1 else pools[0]
        return ok, steps, wall, found, pool

    def _crc(self, length: int) -> tuple[np.ndarray, int]:
        crc = self._crcs.get(length)
        if crc is None:
            if len(self._crcs) >= _MAX_TABLES:
                self._crcs.clear()
            crc = self._crcs[length] = _crc_table(length)
        return crc

    def _matcher(
        self,
        table: dict[bytes, tuple[str, ...]],
        crc: tuple[np.ndarray, int],
        layout: _Layout,
        edits: int,
    ) -> _Matcher:
        key = (id(table), layout)
        cached = self._matchers.get(key)
        if cached is not None and cached[0] == edits:
            return cached[1]
        if len(self._matchers) >= _MAX_MATCHERS:
            self._matchers.clear()
        matcher = _Matcher(table, crc, layout)
        self._matchers[key] = (edits, matcher)
        return matcher


def _step_width(first_bytes: list[int]) -> int:
    """The length of the varint these bytes begin with, 0 if longer than them."""
    for i, byte in enumerate(first_bytes):
        if byte < 128:
            return i + 1
    return 0


def _all_width(data: np.ndarray, width: int) -> bool:
    """Whether every row's step varint is `width` bytes long, column by column."""
    if not bool((data[:, _STEP + width - 1] < 128).all()):
        return False
    return all(bool((data[:, _STEP + i] >= 128).all()) for i in range(width - 1))


def _shared(values: np.ndarray) -> list[Any]:
    """The values as Python objects, one object for each run of equal neighbours (by
    bits): a step's tags share its step, and often its wall time, and a backfill holds
    hundreds of thousands of them."""
    bits = values.view(np.uint64)
    if len(bits) < 2:
        return values.tolist()
    starts = np.flatnonzero(bits[1:] != bits[:-1]) + 1
    if len(starts) * 2 > len(bits):  # mostly distinct: sharing would save little
        return values.tolist()
    starts = np.concatenate(([0], starts))
    counts = np.diff(starts, append=len(bits))
    return list(chain.from_iterable(map(repeat, values[starts].tolist(), counts.tolist())))
