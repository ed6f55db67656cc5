"""TensorBoard event files → `Row`s, fast enough to backfill a long run in seconds.

Nearly every record a training job writes is the same bytes with three fields
changed: `Event{wall_time, step, summary{value{tag, simple_value}}}`. Parsing
that with protobuf (upb) and reading the attributes costs ~3 µs a record;
recognising it costs one dict lookup. So decoding has three tiers:

1. templates: the bytes between the step varint and the value identify tag and
   encoding; once seen, a record is decoded by one slice and one lookup.
   Tensor-encoded float scalars (TF2/Keras, torch `new_style`) get templates
   too, keyed on the metadata that trails the value; so do events of several
   simple values (TF1's merged summaries), by the bytes between their floats.
2. a hand-rolled wire parser for summaries of float scalars (simple_value, or
   rank-0 float/double tensors; one or several per event). It registers a
   template for single-value events.
3. protobuf `ParseFromString` for everything else: other dtypes, histograms,
   non-summary events, anything tier 2 does not understand completely.

Tiers 1 and 2 accept only bytes they understand completely and hand anything
else down, so they change speed, never results. On a backfill, tier 1 runs a
group of records at a time (`event_batch`: one numpy operation per check over
the group, the CRC included); a record the group does not take comes here.

TF1-style writers attach plugin metadata to a tag's first event only, so the
plugin of each tag is remembered (the first wins, as in TensorBoard) and kept in
`snapshot()`: a daemon resuming mid-file still knows a bare tensor is a scalar.
A rank-0 numeric tensor of a tag with no known plugin is taken as a scalar too,
as TensorBoard lists it among tensors; tensors of other plugins are ignored.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from crc32c import crc32c
from google.protobuf.message import DecodeError as ProtoDecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2, types_pb2

from trainsentry.point import Row, no_collection
from trainsentry.sources.base import Decoded, DecodeError, Shapes
from trainsentry.sources.summary_values import histo_buckets, histogram_samples, tensor_values
from trainsentry.sources.tfrecord import FOOTER_BYTES, HEADER_BYTES, Framer

if TYPE_CHECKING:
    from trainsentry.sources.event_batch import Group

_F64 = struct.Struct("<d")
_SCALARS, _HISTOGRAMS = "scalars", "histograms"
_new = tuple.__new__  # Row(...) would run NamedTuple's Python-level __new__

# total record bytes; header+data+crc -> (data, crc); data -> fields (see _frame) or None;
# offset of the value; template lookup for the record's shape; the bytes after the value
_Frame = tuple[
    int, Callable[[bytes, int], tuple[Any, ...]], Callable[[bytes], tuple[Any, ...]] | None,
    int, Callable[[bytes], tuple[str, ...] | None], bytes, tuple[str, bytes],
]  # fmt: skip
# tag, offset of the value, struct format, is a tensor, serialized metadata
_Value = tuple[str, int, str, bool, bytes | None]
_SIMPLE = ("<f", b"")
# bytes after the step that key a several-value template: the summary's and its first
# value's headers, which end before the first float whatever the tag (tier 2 wants one)
_MANY_KEY = 6
# Records (or cycles of them) decoded a group at a time (event_batch.py): enough that
# numpy's ~60 calls a group are spread thin (of 512 to 4096 tried, 4096 read fastest;
# peak memory the same within a MiB), few enough that a group's arrays stay small.
_BATCH = 4096
# The longest cycle of record lengths looked for (tags of several lengths logged in
# turn, one step after another): a step's tags, as many as a run commonly logs.
_PERIOD = 64
# Below this many records of one length, those fixed costs outweigh the per-record
# path's µs a record; a live tail's few records a read never reach it.
MIN_GROUP = 32
# Longest record given to a group: its CRC table costs 1 KiB per byte of record, and
# longer records (histograms, images) are never templated anyway.
MAX_RECORD = 256


class TfEventsDecoder:
    """Decodes `*tfevents*` files; `at_eof` changes nothing, a partial record always waits."""

    def __init__(self) -> None:
        self._framer = Framer()
        self._plugins: dict[str, str] = {}
        self._frames: dict[bytes, _Frame] = {}
        # (value format, bytes after the value) -> {bytes between step and value: (tag,)}
        self._shapes: dict[tuple[str, bytes], dict[bytes, tuple[str, ...]]] = {_SIMPLE: {}}
        self._tags = Shapes()  # a row's tags tuple, one object per shape
        # (record length, its first bytes after the step) -> a several-value template
        self._many: dict[tuple[int, bytes], _Many] = {}
        self._group: Group | None = None
        # Counts of changes to the template tables (a group's matchers are made again
        # after one), and of templates forgotten (rows made ahead may no longer hold).
        self._edits = 0
        self._forgotten = 0
        self._grouped = 0  # records the last batch decoded as groups

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        buf = data if isinstance(data, bytes) else bytes(data)
        rows: list[Row] = []
        errors: list[DecodeError] = []
        with no_collection():  # a row a record, by the hundred thousand on a backfill
            consumed = self._run(buf, rows, errors, file_time)
        return Decoded(consumed, rows, errors)

    def snapshot(self) -> dict[str, Any]:
        return {"plugins": dict(self._plugins), "resyncing": self._framer.resyncing}

    def restore(self, state: dict[str, Any]) -> None:
        self._plugins = {str(k): str(v) for k, v in (state.get("plugins") or {}).items()}
        self._framer.resyncing = bool(state.get("resyncing", False))
        self._forget_templates()

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A rewritten event file starts framing afresh, but its tags keep their plugins."""
        for tag, plugin in (previous.get("plugins") or {}).items():
            self._plugins.setdefault(str(tag), str(plugin))
        self._forget_templates()

    def _run(self, buf: bytes, rows: list[Any], errors: list[DecodeError], ftime: float) -> int:
        """Records a group at a time where a run of them is templated (`_batch`), else one
        by one (`_one`).

        Only records whose header is already known and complete are decoded;
        anything else (first sight of a length, a partial or corrupt record) goes
        through the framer, which registers the header, and the record is then
        taken again.
        """
        get_frame = self._frames.get
        size = len(buf)
        pos = self._reframe(buf, 0, errors) if self._framer.resyncing else 0
        batch_from = 0
        while pos >= 0:
            if pos >= batch_from:
                self._grouped = 0
                done = self._batch(buf, pos, rows, errors, ftime)
                if done != pos:
                    if not self._grouped:  # none templated (histograms, text): not soon again
                        batch_from = done + (done - pos) * 8
                    pos = done
                    continue
                batch_from = pos + MIN_GROUP * 16  # too few records here: one by one a while
            frame = get_frame(buf[pos : pos + HEADER_BYTES])
            if (
                frame is not None
                and pos + frame[0] <= size
                and self._one(buf, pos, frame, rows, errors, ftime)
            ):
                pos += frame[0]
                continue
            pos = self._reframe(buf, pos, errors)
        return -pos - 1

    def _batch(
        self, buf: bytes, pos: int, rows: list[Any], errors: list[DecodeError], ftime: float
    ) -> int:
        """Decodes the known, complete records from `pos` a length at a time; returns
        where it stopped, `pos` if there were too few to be worth it."""
        size = len(buf)
        first = self._frames.get(buf[pos : pos + HEADER_BYTES])
        if first is None:
            return pos
        if (size - pos) // first[0] < MIN_GROUP:
            return pos
        # The common case first: a run of records of one length (torch writes every tag
        # of a step in records of one length), read in place.
        head = buf[pos : pos + HEADER_BYTES]
        run = self._grouper().repeats(buf, pos, [head], min(_BATCH, (size - pos) // first[0]))
        if run >= MIN_GROUP:
            starts = range(pos, pos + run * first[0], first[0])
            return self._emit(buf, starts, [(first, range(run), starts)], rows, errors, ftime)
        done = self._cycle(buf, pos, rows, errors, ftime)
        return self._mixed(buf, pos, rows, errors, ftime) if done is None else done

    def _cycle(
        self, buf: bytes, pos: int, rows: list[Any], errors: list[DecodeError], ftime: float
    ) -> int | None:
        """Tags of several lengths logged in the same order every step: the lengths
        repeat with a period, so the records of each place in the cycle lie at a
        fixed stride and are read in place as a group. None where no period is found."""
        get_frame = self._frames.get
        size = len(buf)
        frames: list[_Frame] = []
        heads: list[bytes] = []
        at = pos
        for _ in range(2 * _PERIOD):
            head = buf[at : at + HEADER_BYTES]
            frame = get_frame(head)
            if frame is None or at + frame[0] > size:
                break
            frames.append(frame)
            heads.append(head)
            at += frame[0]
        period = next(
            (
                p
                for p in range(2, len(heads) // 2 + 1)
                if all(heads[i] == heads[i + p] for i in range(len(heads) - p))
            ),
            0,
        )
        if not period:
            return None
        cycle = sum(frame[0] for frame in frames[:period])
        count = min(_BATCH, (size - pos) // cycle)
        run = self._grouper().repeats(buf, pos, heads[:period], count) if count else 0
        if run < MIN_GROUP:
            return None
        groups: list[tuple[_Frame, range, range]] = []
        at = pos
        for place, frame in enumerate(frames[:period]):
            members = range(place, run * period, period)
            groups.append((frame, members, range(at, at + run * cycle, cycle)))
            at += frame[0]
        places = [starts.start - pos for _, _, starts in groups]
        offsets = [pos + c * cycle + place for c in range(run) for place in places]
        return self._emit(buf, offsets, groups, rows, errors, ftime)

    def _mixed(
        self, buf: bytes, pos: int, rows: list[Any], errors: list[DecodeError], ftime: float
    ) -> int:
        """Records of several lengths in no repeating order: framed one by one, then
        decoded a length at a time."""
        get_frame = self._frames.get
        size = len(buf)
        found: list[int] = []
        lengths: dict[int, tuple[_Frame, list[int]]] = {}
        at = pos
        for i in range(_BATCH):
            frame = get_frame(buf[at : at + HEADER_BYTES])
            if frame is None or at + frame[0] > size:
                break
            found.append(at)
            members = lengths.get(frame[0])
            if members is None:
                lengths[frame[0]] = (frame, [i])
            else:
                members[1].append(i)
            at += frame[0]
        if len(found) < MIN_GROUP:
            return pos
        groups = [
            (frame, members, [found[i] for i in members])
            for frame, members in lengths.values()
            if len(members) >= MIN_GROUP
        ]
        return self._emit(buf, found, groups, rows, errors, ftime)

    def _emit(
        self,
        buf: bytes,
        offsets: Sequence[int],
        groups: Sequence[tuple[_Frame, Sequence[int], Sequence[int]]],
        rows: list[Any],
        errors: list[DecodeError],
        ftime: float,
    ) -> int:
        """Rows for the records at `offsets`, in order: the groups' templated ones made at
        once, every other one decoded alone. Returns where the next record begins, or
        the offset of one whose CRC fails (for the framer to report and skip)."""
        made: list[Any] = [None] * len(offsets)
        group = self._grouper()
        grouped = 0
        for frame, members, starts in groups:
            total, _, _, cut, _, tail, shape = frame
            if total - HEADER_BYTES - FOOTER_BYTES > MAX_RECORD:
                continue
            table = self._shapes[shape]
            taken, fields = group.decode(
                buf, starts, total, cut, shape[0], tail, table, self._edits
            )
            grouped += len(fields[0])
            new = map(_new, repeat(Row), zip(*fields[:3], zip(fields[3]), strict=True))
            if taken is None and len(members) == len(made):
                made = list(new)
            elif taken is None and isinstance(members, range):
                made[members.start : members.stop : members.step] = new
            else:
                places = members if taken is None else [members[i] for i in taken]
                for i, row in zip(places, new, strict=True):
                    made[i] = row
        self._grouped = grouped
        if grouped == len(made):
            rows.extend(made)
            return offsets[-1] + self._frames[buf[offsets[-1] : offsets[-1] + HEADER_BYTES]][0]
        get_frame = self._frames.get
        add = rows.append
        forgotten = self._forgotten
        for at, row in zip(offsets, made, strict=True):
            if row is not None:
                add(row)
                continue
            known = get_frame(buf[at : at + HEADER_BYTES])
            if known is None or not self._one(buf, at, known, rows, errors, ftime):
                return at  # its header was forgotten, or its CRC fails
            if self._forgotten != forgotten:  # the rows made ahead may not hold now
                return at + known[0]
        last = offsets[-1]
        return last + get_frame(buf[last : last + HEADER_BYTES])[0]  # type: ignore[index]

    def _grouper(self) -> Group:
        if self._group is None:
            # Imported on first need: numpy costs 11 MB, and a daemon that only follows
            # live runs (a few records a read) never decodes a group.
            from trainsentry.sources.event_batch import Group

            self._group = Group()
        return self._group

    def _one(
        self,
        buf: bytes,
        pos: int,
        frame: _Frame,
        rows: list[Any],
        errors: list[DecodeError],
        ftime: float,
    ) -> bool:
        """One complete record of a known header; False if its data fails its CRC."""
        _, body, fields, cut, lookup, tail, _ = frame
        data, stored = body(buf, pos)
        c = crc32c(data)
        if (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF != stored:
            return False
        if fields is not None:
            b0, wall_time, b9, b10, b11, b12, value = fields(data)
            if b0 == 9 and b9 == 16:  # wall_time (field 1), step (field 2)
                if b10 < 128:
                    step, j = b10, 11
                elif b11 < 128:
                    step, j = b10 + (b11 << 7) - 0x80, 12
                elif b12 < 128:
                    step, j = b10 + (b11 << 7) + (b12 << 14) - 0x4080, 13
                else:
                    step, j = _step_at_10(data)
                tags = lookup(data[j:cut])
                if tags is not None and (not tail or data.endswith(tail)):
                    rows.append(_new(Row, (step, wall_time, tags, (value,))))
                    return True
                if self._shaped(buf, pos, data, j, step, rows.append):
                    return True
                many = self._many.get((len(data), data[j : j + _MANY_KEY]))
                stamp = wall_time or ftime
                if many is not None and many.take(data, j, step, stamp, rows):
                    return True
        self._slow(buf, pos, data, ftime, rows, errors)
        return True

    def _reframe(self, buf: bytes, pos: int, errors: list[DecodeError]) -> int:
        """Where the next good record starts (its header now known), or -1-resume to stop."""
        start, end = self._framer.next_record(buf, pos, errors)
        if start < 0:
            return -end - 1
        header = buf[start - HEADER_BYTES : start]
        if header not in self._frames:
            self._frame(header, end - start, _SIMPLE)
        return start - HEADER_BYTES

    def _frame(self, header: bytes, length: int, shape: tuple[str, bytes]) -> None:
        fmt, tail = shape
        at = length - len(tail) - (4 if fmt == "<f" else 8)
        # first byte, wall_time, the 4 bytes after it (step), the value
        layout = f"<BdBBBB{at - 13}x{fmt[1]}{len(tail)}x"
        fields = struct.Struct(layout).unpack if at >= 13 else None
        body = struct.Struct(f"<{HEADER_BYTES}x{length}sI").unpack_from
        if len(self._frames) >= 4096:
            self._frames.clear()
        total = HEADER_BYTES + length + FOOTER_BYTES
        self._frames[header] = (total, body, fields, at, self._shapes[shape].get, tail, shape)

    def _shaped(
        self, buf: bytes, pos: int, data: bytes, j: int, step: int, add: Callable[[Any], None]
    ) -> bool:
        """Templates of other shapes than the frame's guess; a hit becomes the new guess."""
        n = len(data)
        for shape, table in self._shapes.items():
            fmt, tail = shape
            at = n - len(tail) - (4 if fmt == "<f" else 8)
            tags = table.get(data[j:at]) if at > j else None
            if tags is not None and data.endswith(tail):
                value = struct.unpack_from(fmt, data, at)[0]
                add(_new(Row, (step, _F64.unpack_from(data, 1)[0], tags, (value,))))
                self._frame(buf[pos : pos + HEADER_BYTES], n, shape)
                return True
        return False

    def _register(self, header: bytes, data: bytes, key_at: int, value: _Value) -> None:
        tag, at, fmt = value[:3]
        shape = (fmt, data[at + (4 if fmt == "<f" else 8) :])
        table = self._shapes.get(shape)
        if table is None:
            if len(self._shapes) >= 16:
                return
            table = self._shapes[shape] = {}
        if len(table) >= 65536:
            table.clear()
        table[data[key_at:at]] = self._tags((tag,))
        self._edits += 1
        frame = self._frames.get(header)
        if frame is not None and frame[4] != table.get:
            self._frame(header, len(data), shape)  # guess this shape for this length next

    def _forget_templates(self) -> None:
        self._edits += 1
        self._forgotten += 1
        for table in self._shapes.values():
            table.clear()
        self._many.clear()

    def _slow(
        self,
        buf: bytes,
        pos: int,
        data: bytes,
        ftime: float,
        out: list[Any],
        errors: list[DecodeError],
    ) -> None:
        """Tier 2, falling back to tier 3."""
        try:
            parsed = _parse_float_summaries(data)
            if parsed is not None:
                for tag, _, _, is_tensor, metadata in parsed[3]:
                    if metadata is not None:
                        self._remember(tag, summary_pb2.SummaryMetadata.FromString(metadata))
                    if is_tensor and self._plugins.get(tag, _SCALARS) != _SCALARS:
                        parsed = None  # a tensor another plugin owns
                        break
        except (IndexError, ValueError, struct.error, ProtoDecodeError):
            parsed = None
        if parsed is None:
            self._decode_proto(data, pos, ftime, out, errors)
            return
        wall_time, step, step_end, values = parsed
        if values:
            tags = self._tags(tuple(v[0] for v in values))
            floats = tuple(struct.unpack_from(v[2], data, v[1])[0] for v in values)
            out.append(_new(Row, (step, wall_time or ftime, tags, floats)))
        if not (wall_time and data[0] == 9 and data[9] == 16):
            return
        if len(values) == 1:
            self._register(buf[pos : pos + HEADER_BYTES], data, step_end, values[0])
        elif values and all(v[2] == "<f" and not v[3] and v[4] is None for v in values):
            if len(self._many) >= 4096:
                self._many.clear()
            key = (len(data), data[step_end : step_end + _MANY_KEY])
            self._many[key] = _Many(data, step_end, values, self._tags)

    def _decode_proto(
        self, data: bytes, offset: int, ftime: float, out: list[Any], errors: list[DecodeError]
    ) -> None:
        """Tier 3: whatever protobuf makes of it."""
        event = event_pb2.Event()
        try:
            event.ParseFromString(data)
        except ProtoDecodeError as exc:
            errors.append(DecodeError(offset, f"record is not an Event protobuf: {exc}"))
            return
        if event.WhichOneof("what") != "summary":
            return
        found: list[Any] = []
        try:
            self._summary(event, ftime, found)
        except Exception as exc:  # one odd record must not stop a daemon
            errors.append(DecodeError(offset, f"event could not be interpreted: {exc!r}"))
            return
        if found:  # (tag, step, wall time, value) each, all of one step and stamp
            tags = self._tags(tuple(f[0] for f in found))
            step, wall_time = found[0][1], found[0][2]
            out.append(_new(Row, (step, wall_time, tags, tuple(f[3] for f in found))))

    def _summary(self, event: event_pb2.Event, ftime: float, out: list[Any]) -> None:
        wall_time = event.wall_time or ftime
        step = event.step
        for value in event.summary.value:
            tag = sys.intern(value.tag or value.node_name)
            if value.HasField("metadata"):
                self._remember(tag, value.metadata)
            which = value.WhichOneof("value")
            if which == "simple_value":
                out.append((tag, step, wall_time, value.simple_value))
            elif which == "histo":
                buckets = histo_buckets(value.histo)
                out.extend(histogram_samples(tag, step, wall_time, buckets, value.histo))
            elif which == "tensor":
                plugin = self._plugins.get(tag, "")
                tensor = value.tensor
                if plugin == _HISTOGRAMS:
                    flat = tensor_values(tensor) or []
                    rows = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat) - 2, 3)]
                    out.extend(histogram_samples(tag, step, wall_time, rows, None))
                elif plugin in ("", _SCALARS) and not tensor.tensor_shape.dim:
                    flat = tensor_values(tensor) or []
                    out.extend((tag, step, wall_time, v) for v in flat[:1])

    def _remember(self, tag: str, metadata: summary_pb2.SummaryMetadata) -> None:
        if tag in self._plugins:
            return
        scalar = metadata.data_class == summary_pb2.DATA_CLASS_SCALAR
        plugin = _SCALARS if scalar else metadata.plugin_data.plugin_name
        if plugin:
            self._plugins[tag] = plugin
            # Templates of bare tensors under this tag assumed "no plugin".
            self._forget_templates()


class _Many:
    """Tier 1 for an event of several simple values (TF1's merged summaries, writers that
    log every scalar of a step in one Summary): the bytes after the step are those of
    a record tier 2 understood completely, except the floats. One struct unpack
    yields the bytes between the floats and the floats; the record is taken only
    when every byte between them is as in that record, so tags and structure are."""

    __slots__ = ("_between", "_size", "_tags", "_unpack")

    def __init__(self, data: bytes, start: int, values: list[_Value], shapes: Shapes) -> None:
        cuts = [start] + [c for v in values for c in (v[1], v[1] + 4)] + [len(data)]
        between = [data[cuts[i] : cuts[i + 1]] for i in range(0, len(cuts), 2)]
        self._between = tuple(between)
        self._tags = shapes(tuple(v[0] for v in values))
        fmt = "".join(f"{len(b)}sf" for b in between[:-1]) + f"{len(between[-1])}s"
        layout = struct.Struct("<" + fmt)
        self._unpack, self._size = layout.unpack_from, layout.size

    def take(self, data: bytes, start: int, step: int, wall: float, out: list[Any]) -> bool:
        if len(data) - start != self._size:  # the step took another number of bytes
            return False
        fields = self._unpack(data, start)
        if fields[0::2] != self._between:
            return False
        out.append(_new(Row, (step, wall, self._tags, fields[1::2])))
        return True


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 70:
        b = data[pos]
        pos += 1
        result |= (b & 127) << shift
        if b < 128:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _step_at_10(data: bytes) -> tuple[int, int]:
    """A long step varint, or (0, 0) for a broken one: no template starts at 0, tier 2 decides."""
    try:
        step, end = _varint(data, 10)
    except (IndexError, ValueError):
        return 0, 0
    return _int64(step), end


def _parse_float_summaries(d: bytes) -> tuple[float, int, int, list[_Value]] | None:
    """Tier 2: an Event of wall_time, step and a summary of float scalars, else None."""
    n = len(d)
    pos = step = step_end = 0
    wall_time = 0.0
    values: list[_Value] | None = None
    while pos < n:
        key = d[pos]
        if key == 0x09:
            wall_time = _F64.unpack_from(d, pos + 1)[0]
            pos += 9
        elif key == 0x10:
            step, pos = _varint(d, pos + 1)
            step_end = pos
        elif key == 0x2A and values is None:
            length, pos = _varint(d, pos + 1)
            end = pos + length
            values = []
            while pos < end:
                if d[pos] != 0x0A:
                    return None
                length, pos = _varint(d, pos + 1)
                value = _parse_value(d, pos, pos + length) if pos + length <= end else None
                if value is None:
                    return None
                values.append(value)
                pos += length
        else:
            return None
    if values is None or pos != n:
        return None
    return wall_time, _int64(step), step_end, values


def _parse_value(d: bytes, pos: int, end: int) -> _Value | None:
    tag: bytes | None = None
    metadata: bytes | None = None
    at, fmt, is_tensor = -1, "", False
    while pos < end:
        key = d[pos]
        if key == 0x15 and at < 0 and pos + 5 <= end:  # simple_value, fixed32
            at, fmt, pos = pos + 1, "<f", pos + 5
            continue
        if key not in (0x0A, 0x42, 0x4A):
            return None
        length, pos = _varint(d, pos + 1)
        stop = pos + length
        if stop > end:
            return None
        if key in (0x0A, 0x4A) and (tag if key == 0x0A else metadata) is not None:
            # a field written twice: protobuf keeps the last tag but checks every one's
            # UTF-8, and merges metadata; a damaged record, for protobuf to judge
            return None
        if key == 0x0A:
            tag = d[pos:stop]
        elif key == 0x4A:
            metadata = d[pos:stop]
        else:
            found = _parse_scalar_tensor(d, pos, stop) if at < 0 else None
            if found is None:
                return None
            (at, fmt), is_tensor = found, True
        pos = stop
    if not tag or at < 0:
        return None
    return sys.intern(tag.decode()), at, fmt, is_tensor, metadata


def _parse_scalar_tensor(d: bytes, pos: int, end: int) -> tuple[int, str] | None:
    """Offset and format of a rank-0 float32/float64 TensorProto's value, else None."""
    dtype, at, size, source = 0, -1, 0, 0
    while pos < end:
        key = d[pos]
        if key == 0x08:  # dtype
            dtype, pos = _varint(d, pos + 1)
        elif key in (0x12, 0x22, 0x2A, 0x32):  # shape, tensor_content, packed float/double_val
            length, pos = _varint(d, pos + 1)
            if key == 0x12:
                if length:
                    return None  # has dimensions
            elif at < 0:
                at, size, source = pos, length, key
            else:
                return None
            pos += length
        elif key in (0x2D, 0x31) and at < 0:  # unpacked float_val / double_val
            size = 4 if key == 0x2D else 8
            at, source, pos = pos + 1, 0x2A if key == 0x2D else 0x32, pos + 1 + size
        else:
            return None
    if pos != end:
        return None
    if dtype == types_pb2.DT_FLOAT and size == 4 and source in (0x22, 0x2A):
        return at, "<f"
    if dtype == types_pb2.DT_DOUBLE and size == 8 and source in (0x22, 0x32):
        return at, "<d"
    return None
