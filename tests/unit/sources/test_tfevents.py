"""TfEventsDecoder against files written by the real writers, checked against tbparse.

Every fixture is written by the writer a user would run (torch, tensorboardX,
tensorboard's own EventFileWriter with TF2 encodings); the expected points are
what tbparse (TensorBoard's EventAccumulator) reads from the same file. Where
tbparse cannot read a dtype (its tensor stub fails on ints and bfloat16), the
expectation is the written value converted through numpy/ml_dtypes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tbparse import SummaryReader
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.histogram.summary_v2 import histogram_pb
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from trainsentry.point import Sample
from trainsentry.sources import tfevents
from trainsentry.sources.tfevents import TfEventsDecoder
from trainsentry.sources.tfrecord import Framer, encode_record

VALUES = [0.5, -1.25, 0.0, math.nan, math.inf, -math.inf, 3.0e38, 1e-30, 7.0]
# Varints of 1, 2, 3, 4 and 5 bytes.
STEPS = [0, 1, 127, 128, 16383, 16384, 2_097_151, 2_097_152, 300_000_000, 10**10]
TAGS = ["loss", "train/grad_norm", "lr", "métrique/ü"]
FILE_TIME = 1234.5


def event_file(directory: Path) -> Path:
    (path,) = sorted(directory.rglob("*tfevents*"))
    return path


def decode(path: Path, decoder: TfEventsDecoder | None = None) -> list[Sample]:
    data = path.read_bytes()
    decoded = (decoder or TfEventsDecoder()).feed(data, at_eof=True, file_time=FILE_TIME)
    assert decoded.errors == []
    assert decoded.consumed == len(data)
    return decoded.samples


def triples(rows: Any) -> list[tuple[str, int, bool, float]]:
    """(tag, step, value) made sortable and comparable, NaN equal to NaN."""
    out = []
    for tag, step, value in rows:
        value = float(value)
        out.append((tag, int(step), math.isnan(value), 0.0 if math.isnan(value) else value))
    return sorted(out)


def ours(samples: list[Sample]) -> list[tuple[str, int, bool, float]]:
    return triples((s.tag, s.step, s.value) for s in samples)


def tbparse(directory: Path, kind: str, tags: Any = None) -> list[tuple[str, int, bool, float]]:
    frame = getattr(SummaryReader(str(directory), event_types={kind}), kind)
    rows = zip(frame["tag"], frame["step"], frame["value"], strict=True)
    return triples(row for row in rows if tags is None or row[0] in tags)


def write_events(directory: Path, events: list[event_pb2.Event]) -> Path:
    writer = EventFileWriter(str(directory))
    for event in events:
        writer.add_event(event)
    writer.close()
    return directory


def summary_event(step: int, *values: summary_pb2.Summary.Value) -> event_pb2.Event:
    return event_pb2.Event(
        wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=list(values))
    )


@pytest.fixture(scope="module")
def torch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    directory = tmp_path_factory.mktemp("torch")
    writer = SummaryWriter(str(directory))
    for i, step in enumerate(STEPS):
        for t, tag in enumerate(TAGS):
            writer.add_scalar(tag, VALUES[(i + t) % len(VALUES)], step)
    writer.add_text("notes", "not a number", 3)
    writer.add_image("picture", np.zeros((3, 4, 4)), 3)
    writer.close()
    return directory


@pytest.fixture(scope="module")
def torch_new_style_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    directory = tmp_path_factory.mktemp("torch_new_style")
    writer = SummaryWriter(str(directory))
    for i, step in enumerate(STEPS):
        writer.add_scalar("f32", VALUES[i % len(VALUES)], step, new_style=True)
        value = VALUES[(i + 1) % len(VALUES)]
        writer.add_scalar("f64", value, step, new_style=True, double_precision=True)
    writer.close()
    return directory


@pytest.fixture(scope="module")
def tensorboardx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tensorboardX import SummaryWriter

    directory = tmp_path_factory.mktemp("tensorboardx")
    writer = SummaryWriter(str(directory))
    for i, step in enumerate(STEPS):
        for t, tag in enumerate(TAGS[:3]):
            writer.add_scalar(tag, VALUES[(i + t) % len(VALUES)], step)
    writer.add_scalar("described", 2.5, 1, display_name="Described", summary_description="why")
    writer.close()
    return directory


@pytest.fixture(scope="module")
def tf2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    events = [
        summary_event(step, *scalar_pb(tag, VALUES[(i + t) % len(VALUES)]).value)
        for i, step in enumerate(STEPS)
        for t, tag in enumerate(TAGS)
    ]
    return write_events(tmp_path_factory.mktemp("tf2"), events)


@pytest.fixture(scope="module")
def tf1_style_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TF1's FileWriter keeps plugin metadata on the first event of each tag only."""
    events = []
    seen: set[str] = set()
    for i, step in enumerate(STEPS):
        values = [
            *scalar_pb("epoch_loss", VALUES[i % len(VALUES)]).value,
            *histogram_pb("weights", np.linspace(-1.0, 2.0 + i, 50)).value,
        ]
        for value in values:
            if value.tag in seen:
                value.ClearField("metadata")
            seen.add(value.tag)
            events.append(summary_event(step, value))
    return write_events(tmp_path_factory.mktemp("tf1_style"), events)


@pytest.fixture(scope="module")
def tf1_histograms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bare [k, 3] tensors after the first: meaningless without the remembered plugin."""
    events = []
    for i, step in enumerate(STEPS):
        for j, value in enumerate(histogram_pb("w", np.arange(5.0 + i)).value):
            if i or j:
                value.ClearField("metadata")
            events.append(summary_event(step, value))
    return event_file(write_events(tmp_path_factory.mktemp("tf1_histograms"), events))


@pytest.fixture(scope="module")
def multi_value_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    events = [
        summary_event(
            step,
            *(
                summary_pb2.Summary.Value(tag=tag, simple_value=VALUES[(i + t) % len(VALUES)])
                for t, tag in enumerate(TAGS)
            ),
        )
        for i, step in enumerate(STEPS)
    ]
    return write_events(tmp_path_factory.mktemp("multi_value"), events)


def _tensor_scalar(dtype: Any, value: float, content: bool) -> tensor_pb2.TensorProto:
    if dtype is ml_dtypes.bfloat16:
        bits = int(np.array(value, dtype=ml_dtypes.bfloat16).view(np.uint16))
        if content:
            return tensor_pb2.TensorProto(
                dtype=types_pb2.DT_BFLOAT16, tensor_content=np.uint16(bits).tobytes()
            )
        return tensor_pb2.TensorProto(dtype=types_pb2.DT_BFLOAT16, half_val=[bits])
    proto: tensor_pb2.TensorProto = tensor_util.make_tensor_proto(np.array(value, dtype=dtype))
    if content:  # the encoding TF's C++ writer (Keras) uses
        raw = np.array(value, dtype=dtype).tobytes()
        proto = tensor_pb2.TensorProto(dtype=proto.dtype, tensor_content=raw)
    return proto


DTYPES: list[tuple[str, Any, list[float]]] = [
    ("half", np.float16, [0.1, -2.5, math.nan, math.inf, 65504.0]),
    ("bfloat16", ml_dtypes.bfloat16, [0.1, -2.5, math.nan, -math.inf, 3.0e38]),
    ("float32", np.float32, [0.1, math.nan, math.inf, 1e-40]),
    ("float64", np.float64, [0.1, math.nan, -math.inf, 1e300]),
    ("int32", np.int32, [0, -7, 2**31 - 1]),
    ("int64", np.int64, [0, -7, 2**53]),
    ("uint8", np.uint8, [0, 200, 255]),
]


def _dtypes_dir(directory: Path, dtypes: list[tuple[str, Any, list[float]]]) -> Path:
    metadata = scalar_pb("x", 0.0).value[0].metadata
    events = []
    for name, dtype, values in dtypes:
        for content in (False, True):
            for step, value in enumerate(values):
                tensor = _tensor_scalar(dtype, value, content)
                tag = f"{name}/{'content' if content else 'typed'}"
                events.append(summary_event(step, summary_pb2.Summary.Value(
                    tag=tag, tensor=tensor, metadata=metadata
                )))  # fmt: skip
    return write_events(directory, events)


TBPARSE_READS = ("half", "float32", "float64")  # its tensor stub fails on ints and bfloat16


@pytest.fixture(scope="module")
def float_dtypes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dtypes = [d for d in DTYPES if d[0] in TBPARSE_READS]
    return _dtypes_dir(tmp_path_factory.mktemp("float_dtypes"), dtypes)


@pytest.fixture(scope="module")
def other_dtypes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dtypes = [d for d in DTYPES if d[0] not in TBPARSE_READS]
    return _dtypes_dir(tmp_path_factory.mktemp("other_dtypes"), dtypes)


@pytest.fixture(scope="module")
def histogram_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tensorboardX import SummaryWriter as XWriter
    from torch.utils.tensorboard import SummaryWriter

    dirs = {}
    for name, writer_type in (("torch", SummaryWriter), ("tensorboardx", XWriter)):
        dirs[name] = tmp_path_factory.mktemp(f"histo_{name}")
        writer = writer_type(str(dirs[name]))
        for step, data in enumerate(HISTOGRAM_DATA):
            writer.add_histogram("act", data, step)
        writer.close()
    events = [summary_event(s, *histogram_pb("act", d).value) for s, d in enumerate(HISTOGRAM_DATA)]
    dirs["tf2"] = write_events(tmp_path_factory.mktemp("histo_tf2"), events)
    return dirs


_rng = np.random.default_rng(0)
HISTOGRAM_DATA = [
    np.maximum(_rng.normal(0.2, 1.0, 1000), 0.0),  # ReLU output: about 42% exact zeros
    _rng.normal(-3.0, 0.5, 300),
    np.array([0.0, 0.0, 0.0, 1.0, 2.0, -1.0]),
    np.full(10, 4.0),
]


# -- the decoded points are what TensorBoard itself reads ---------------------------------


def test_torch_scalars_equal_tbparse(torch_dir: Path) -> None:
    assert ours(decode(event_file(torch_dir))) == tbparse(torch_dir, "scalars")


def test_torch_new_style_scalars_equal_tbparse(torch_new_style_dir: Path) -> None:
    samples = decode(event_file(torch_new_style_dir))
    assert ours(samples) == tbparse(torch_new_style_dir, "tensors")


def test_torch_add_scalars_files_each_equal_tbparse(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    for i, step in enumerate(STEPS):
        writer.add_scalars("run", {"train": VALUES[i % 9], "val": VALUES[(i + 4) % 9]}, step)
    writer.close()
    subdirs = [p.parent for p in tmp_path.rglob("*tfevents*") if p.parent != tmp_path]
    assert len(subdirs) == 2
    for subdir in subdirs:
        assert ours(decode(event_file(subdir))) == tbparse(subdir, "scalars")


def test_tensorboardx_scalars_equal_tbparse(tensorboardx_dir: Path) -> None:
    assert ours(decode(event_file(tensorboardx_dir))) == tbparse(tensorboardx_dir, "scalars")


def test_tf2_tensor_scalars_equal_tbparse(tf2_dir: Path) -> None:
    assert ours(decode(event_file(tf2_dir))) == tbparse(tf2_dir, "tensors")


def test_summaries_of_several_values_equal_tbparse(multi_value_dir: Path) -> None:
    assert ours(decode(event_file(multi_value_dir))) == tbparse(multi_value_dir, "scalars")


def test_tf1_style_scalars_without_metadata_equal_tbparse(tf1_style_dir: Path) -> None:
    samples = [s for s in decode(event_file(tf1_style_dir)) if s.tag == "epoch_loss"]
    expected = tbparse(tf1_style_dir, "tensors", tags={"epoch_loss"})
    assert ours(samples) == expected
    assert len(expected) == len(STEPS)


def test_every_dtype_decodes_to_the_value_written(
    float_dtypes_dir: Path, other_dtypes_dir: Path
) -> None:
    expected = [
        (f"{name}/{enc}", step, float(np.array(v, dtype=dtype).astype(np.float64)))
        for name, dtype, values in DTYPES
        for enc in ("typed", "content")
        for step, v in enumerate(values)
    ]
    samples = decode(event_file(float_dtypes_dir)) + decode(event_file(other_dtypes_dir))
    assert ours(samples) == triples(expected)


def test_float_dtypes_equal_tbparse(float_dtypes_dir: Path) -> None:
    assert ours(decode(event_file(float_dtypes_dir))) == tbparse(float_dtypes_dir, "tensors")


def test_events_that_are_not_summaries_produce_nothing(torch_dir: Path) -> None:
    tags = {s.tag for s in decode(event_file(torch_dir))}
    assert tags == set(TAGS)  # no file_version, text or image points


def test_missing_wall_time_falls_back_to_the_file_time(tmp_path: Path) -> None:
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1.5)
    event = event_pb2.Event(step=4, summary=summary_pb2.Summary(value=[value]))
    (sample,) = decode(event_file(write_events(tmp_path, [event])))
    assert sample == Sample("loss", 4, FILE_TIME, 1.5)


# -- histograms ---------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["torch", "tensorboardx"])
def test_histogram_proto_gives_exact_moments_and_the_zero_fraction(
    writer: str, histogram_dirs: dict[str, Path]
) -> None:
    samples = decode(event_file(histogram_dirs[writer]))
    got = {(s.step, s.tag): s.value for s in samples}
    for step, data in enumerate(HISTOGRAM_DATA):
        assert got[(step, "act/mean")] == pytest.approx(data.mean(), rel=1e-9, abs=1e-12)
        assert got[(step, "act/std")] == pytest.approx(data.std(), rel=1e-6, abs=1e-6)
        assert got[(step, "act/min")] == data.min()
        assert got[(step, "act/max")] == data.max()
        assert got[(step, "act/zero_frac")] == pytest.approx(np.mean(data == 0.0))
    assert len(samples) == 5 * len(HISTOGRAM_DATA)


def test_tf2_histogram_tensor_is_reduced_from_its_buckets(histogram_dirs: dict[str, Path]) -> None:
    samples = decode(event_file(histogram_dirs["tf2"]))
    got = {(s.step, s.tag): s.value for s in samples}
    for step, data in enumerate(HISTOGRAM_DATA):
        buckets = tensor_util.make_ndarray(histogram_pb("act", data).value[0].tensor)
        left, right, count = buckets[:, 0], buckets[:, 1], buckets[:, 2]
        centre = (left + right) / 2
        mean = (centre * count).sum() / count.sum()
        width = (right - left).max()
        assert got[(step, "act/mean")] == pytest.approx(mean)
        assert abs(got[(step, "act/mean")] - data.mean()) <= width / 2 + 1e-9
        assert got[(step, "act/std")] == pytest.approx(
            math.sqrt(max((centre**2 * count).sum() / count.sum() - mean**2, 0.0)), abs=1e-9
        )
        assert got[(step, "act/min")] == data.min()
        assert got[(step, "act/max")] == data.max()
        in_zero = count[(left <= 0) & (right >= 0)].sum() / count.sum()
        assert got[(step, "act/zero_frac")] == pytest.approx(in_zero)


def test_tf1_style_histograms_are_recognised_after_their_first_event(tf1_style_dir: Path) -> None:
    steps = [s.step for s in decode(event_file(tf1_style_dir)) if s.tag == "weights/max"]
    assert steps == STEPS


# -- the three decoding tiers change speed, never results --------------------------------


@pytest.mark.parametrize(
    "fixture",
    ["torch_dir", "torch_new_style_dir", "tensorboardx_dir", "tf2_dir", "tf1_style_dir",
     "multi_value_dir", "float_dtypes_dir", "other_dtypes_dir"],
)  # fmt: skip
def test_fast_paths_agree_with_protobuf(
    fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = event_file(request.getfixturevalue(fixture))
    fast = decode(path)
    again = decode(path)
    monkeypatch.setattr(tfevents, "_parse_float_summaries", lambda data: None)
    slow = decode(path)
    assert _same(fast, slow) and _same(again, slow)


def _same(a: list[Sample], b: list[Sample]) -> bool:
    def norm(s: Sample) -> tuple[Any, ...]:  # NaN != NaN; a damaged wall time can be NaN too
        return tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in s)

    return [norm(s) for s in a] == [norm(s) for s in b]


# -- tailing: partial records, corruption, restarts ---------------------------------------


def tail(decoder: TfEventsDecoder, chunks: list[bytes]) -> tuple[list[Sample], list[int]]:
    samples: list[Sample] = []
    errors: list[int] = []
    pending, base = b"", 0
    for chunk in chunks:
        pending += chunk
        decoded = decoder.feed(memoryview(pending), at_eof=True, file_time=FILE_TIME)
        samples += decoded.samples
        errors += [base + e.offset for e in decoded.errors]
        base += decoded.consumed
        pending = pending[decoded.consumed :]
    return samples, errors


def test_file_fed_byte_by_byte_yields_every_point_once(torch_dir: Path) -> None:
    data = event_file(torch_dir).read_bytes()
    samples, errors = tail(TfEventsDecoder(), [data[i : i + 1] for i in range(len(data))])
    assert _same(samples, decode(event_file(torch_dir)))
    assert errors == []


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_snapshot_and_restore_mid_file_equals_a_continuous_read(
    tf1_histograms: Path, data: st.DataObject
) -> None:
    whole = tf1_histograms.read_bytes()
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    first = TfEventsDecoder()
    before = first.feed(whole[:cut], at_eof=True, file_time=FILE_TIME)
    state = json.loads(json.dumps(first.snapshot()))
    resumed = TfEventsDecoder()
    resumed.restore(state)
    after = resumed.feed(whole[before.consumed :], at_eof=True, file_time=FILE_TIME)
    assert _same(before.samples + after.samples, decode(tf1_histograms))


def test_resuming_without_the_snapshot_loses_tf1_histograms(tf1_histograms: Path) -> None:
    """The reason plugins are in the snapshot: bare [k, 3] tensors mean nothing on their own."""
    whole = tf1_histograms.read_bytes()
    first = TfEventsDecoder()
    cut = Framer().split(whole).records[2][0]  # after file_version and the first histogram
    head = first.feed(whole[:cut], at_eof=True, file_time=FILE_TIME)
    rest = whole[head.consumed :]
    assert len(head.samples) == 5
    fresh = TfEventsDecoder().feed(rest, at_eof=True, file_time=FILE_TIME)
    resumed = TfEventsDecoder()
    resumed.restore(first.snapshot())
    assert fresh.samples == []
    assert len(resumed.feed(rest, at_eof=True, file_time=FILE_TIME).samples) > 0


def test_corrupt_record_is_skipped_counted_once_and_the_rest_read(torch_dir: Path) -> None:
    data = event_file(torch_dir).read_bytes()
    records = Framer().split(data).records
    offset, payload = records[len(records) // 2]
    broken = bytearray(data)
    broken[offset + 12 + len(payload) // 2] ^= 0x40
    decoded = TfEventsDecoder().feed(bytes(broken), at_eof=True, file_time=FILE_TIME)
    assert [e.offset for e in decoded.errors] == [offset]
    lost = TfEventsDecoder().feed(data[offset:], at_eof=True, file_time=FILE_TIME).samples[:1]
    expected = [s for s in decode(event_file(torch_dir)) if s not in lost]
    assert _same(decoded.samples, expected)


def test_resyncing_survives_a_restart_so_one_region_is_one_error(torch_dir: Path) -> None:
    data = event_file(torch_dir).read_bytes()
    garbage = bytes(range(7, 250)) * 20
    first = TfEventsDecoder()
    head = first.feed(data + garbage[:1000], at_eof=True, file_time=FILE_TIME)
    assert len(head.errors) == 1
    resumed = TfEventsDecoder()
    resumed.restore(json.loads(json.dumps(first.snapshot())))
    rest = (data + garbage + data)[head.consumed :]
    tail_part = resumed.feed(rest, at_eof=True, file_time=FILE_TIME)
    assert tail_part.errors == []
    assert _same(tail_part.samples, decode(event_file(torch_dir)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048), st.integers(0, 10_000), st.booleans())
def test_garbage_and_mutations_never_raise(
    tf1_histograms: Path, noise: bytes, at: int, insert: bool
) -> None:
    data = tf1_histograms.read_bytes()
    at %= len(data)
    if insert:
        mutated = data[:at] + noise + data[at:]
    else:
        mutated = data[:at] + noise + data[at + len(noise) :]
    for sample in [noise, mutated]:
        decoded = TfEventsDecoder().feed(sample, at_eof=True, file_time=FILE_TIME)
        assert 0 <= decoded.consumed <= len(sample)
        assert all(isinstance(s, Sample) for s in decoded.samples)


def _mixed_payloads() -> list[bytes]:
    """Event payloads of every kind the decoder's own parsers handle."""
    metadata = scalar_pb("x", 0.0).value[0].metadata
    values = [
        summary_pb2.Summary.Value(tag="loss", simple_value=0.25),
        *scalar_pb("acc", 0.5).value,
        summary_pb2.Summary.Value(tag="half", tensor=_tensor_scalar(np.float16, 1.5, False)),
        summary_pb2.Summary.Value(
            tag="f64", tensor=_tensor_scalar(np.float64, 2.5, True), metadata=metadata
        ),
        *histogram_pb("w", np.arange(4.0)).value,
    ]
    events = [summary_event(s, v) for s in (5, 300, 70_000) for v in values]
    events.append(summary_event(9, *values[:2]))
    return [e.SerializeToString() for e in events]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_records_with_valid_crc_but_damaged_events_never_raise(data: st.DataObject) -> None:
    payloads = _mixed_payloads()
    damaged = []
    for _ in range(data.draw(st.integers(1, 8))):
        payload = data.draw(st.sampled_from(payloads))
        at = data.draw(st.integers(0, len(payload)))
        noise = data.draw(st.binary(max_size=6))
        cut = data.draw(st.integers(0, 6))
        damaged.append(payload[:at] + noise + payload[at + cut :])
    damaged.append(data.draw(st.binary(max_size=64)))
    original = b"".join(encode_record(p) for p in payloads)
    stream = original + b"".join(encode_record(p) for p in damaged) + original
    decoded = TfEventsDecoder().feed(stream, at_eof=True, file_time=FILE_TIME)
    assert decoded.consumed == len(stream)
    first = TfEventsDecoder().feed(original, at_eof=True, file_time=FILE_TIME).samples
    assert _same(decoded.samples[-len(first) :], first)  # nothing learnt from damage misleads


def test_a_value_whose_length_swallows_the_next_ones_is_protobufs_to_judge() -> None:
    """Hypothesis found it: one value's length byte damaged to cover the values after
    it makes a Value with its tag written several times. Protobuf checks the UTF-8 of
    every one (a float's bytes in one are not) and refuses the record; the fast path
    had taken the last tag alone."""
    values = [summary_pb2.Summary.Value(tag=t, simple_value=0.5 + i) for i, t in enumerate(TAGS)]
    good = summary_event(5, *values).SerializeToString()
    at = good.index(b"\n\x04loss") - 1  # the first Value's length
    damaged = good[:at] + b"C" + good[at + 1 :]
    stream = b"".join(encode_record(p) for p in (good, damaged, good))
    fast = TfEventsDecoder().feed(stream, at_eof=True, file_time=FILE_TIME)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tfevents, "_parse_float_summaries", lambda data: None)
        slow = TfEventsDecoder().feed(stream, at_eof=True, file_time=FILE_TIME)
    assert len(slow.errors) == 1 and "UTF-8" in slow.errors[0].message
    assert _same(fast.samples, slow.samples)
    assert [e.message for e in fast.errors] == [e.message for e in slow.errors]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_several_value_events_damaged_decode_as_protobuf_decodes_them(
    data: st.DataObject,
) -> None:
    """A record shaped like a known several-value one, bytes changed anywhere, is taken by
    the template only when the change is inside a value: otherwise protobuf decides."""
    values = [summary_pb2.Summary.Value(tag=t, simple_value=0.5 + i) for i, t in enumerate(TAGS)]
    learnt = [summary_event(s, *values).SerializeToString() for s in (5, 6, 300)]
    damaged = []
    for _ in range(data.draw(st.integers(1, 6))):
        payload = data.draw(st.sampled_from(learnt))
        at = data.draw(st.integers(0, len(payload) - 1))
        noise = data.draw(st.binary(min_size=1, max_size=4))
        damaged.append(payload[:at] + noise + payload[at + len(noise) :])
    stream = b"".join(encode_record(p) for p in learnt + damaged + learnt)
    fast = TfEventsDecoder().feed(stream, at_eof=True, file_time=FILE_TIME)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tfevents, "_parse_float_summaries", lambda data: None)
        slow = TfEventsDecoder().feed(stream, at_eof=True, file_time=FILE_TIME)
    assert _same(fast.samples, slow.samples)
    assert [e.offset for e in fast.errors] == [e.offset for e in slow.errors]
