"""The JSON Lines decoder, fed the way the tailer feeds it: bytes from its offset on."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import Sample
from trainsentry.sources.base import DecodeError
from trainsentry.sources.jsonl import JsonlDecoder

FILE_TIME = 1_700_000_000.0


def dumps(**record: object) -> bytes:
    return (json.dumps(record) + "\n").encode()


def read(data: bytes, decoder: JsonlDecoder | None = None) -> list[Sample]:
    decoded = (decoder or JsonlDecoder()).feed(data, at_eof=True, file_time=FILE_TIME)
    assert decoded.errors == []
    return decoded.samples


def follow_growing_file(data: bytes, cuts: list[int]) -> tuple[list[Sample], list[int]]:
    """The file grows to each cut in turn; every read starts at the consumed offset.

    Returns the samples and the absolute offsets of the errors.
    """
    decoder = JsonlDecoder()
    offset = 0
    samples: list[Sample] = []
    errors: list[int] = []
    for size in [*cuts, len(data)]:
        decoded = decoder.feed(data[offset:size], at_eof=True, file_time=FILE_TIME)
        assert 0 <= decoded.consumed <= size - offset
        samples += decoded.samples
        errors += [offset + e.offset for e in decoded.errors]
        offset += decoded.consumed
    return samples, errors


def tags(samples: list[Sample]) -> dict[str, float]:
    return {s.tag: s.value for s in samples}


def test_numeric_fields_become_series_and_step_keys_do_not() -> None:
    samples = read(dumps(step=7, loss=0.5, lr=1e-3, global_step=7, epoch=1))
    assert tags(samples) == {"loss": 0.5, "lr": 1e-3, "epoch": 1.0}
    assert {s.step for s in samples} == {7}


def test_nested_objects_are_flattened_with_a_slash() -> None:
    samples = read(dumps(step=1, train={"loss": 1, "grad": {"norm": 2.5}}))
    assert tags(samples) == {"train/loss": 1.0, "train/grad/norm": 2.5}


def test_bools_strings_nulls_and_lists_are_never_values() -> None:
    line = dumps(step=1, ok=True, name="resnet", missing=None, hist=[1, 2, 3], loss=0.25)
    assert tags(read(line)) == {"loss": 0.25}


def test_step_is_the_first_present_step_key() -> None:
    assert read(dumps(iteration=5, _step=9, loss=1))[0].step == 5
    assert read(dumps(_step=9, iter=4, loss=1))[0].step == 4
    assert read(dumps(global_step=12.0, loss=1))[0].step == 12
    # An unusable step value (null, a name) falls through to the next key.
    assert read(dumps(step=None, global_step=3, loss=1))[0].step == 3


def test_lines_without_a_step_are_numbered_by_a_per_file_counter() -> None:
    decoder = JsonlDecoder()
    data = dumps(loss=1) + dumps(event="eval started") + dumps(loss=2) + dumps(step=50, loss=3)
    data += dumps(loss=4)
    assert [s.step for s in read(data, decoder)] == [0, 1, 50, 2]
    resumed = JsonlDecoder()
    resumed.restore(json.loads(json.dumps(decoder.snapshot())))
    assert [s.step for s in read(dumps(loss=5), resumed)] == [3]


def test_wall_time_is_read_from_numbers_and_iso_strings_else_file_time() -> None:
    assert read(dumps(step=1, loss=1, time=1_750_000_000.5))[0].wall_time == 1_750_000_000.5
    assert (
        read(dumps(step=1, loss=1, _timestamp=1_750_000_000_250))[0].wall_time == 1_750_000_000.25
    )
    iso = read(dumps(step=1, loss=1, timestamp="2025-06-15T12:00:00Z"))[0].wall_time
    assert iso == 1_749_988_800.0
    offset = read(dumps(step=1, loss=1, wall_time="2025-06-15T14:00:00+02:00"))[0].wall_time
    assert offset == 1_749_988_800.0
    assert read(dumps(step=1, loss=1, timestamp="yesterday"))[0].wall_time == FILE_TIME
    assert read(dumps(step=1, loss=1))[0].wall_time == FILE_TIME


def test_a_time_too_small_to_be_a_date_is_a_duration_series() -> None:
    # mmengine logs seconds per iteration as "time" next to "data_time".
    line = dumps(iter=50, loss=1.5, time=0.31, data_time=0.02, timestamp=1_750_000_000)
    samples = read(line)
    assert tags(samples) == {"loss": 1.5, "time": 0.31, "data_time": 0.02}
    assert {s.wall_time for s in samples} == {1_750_000_000.0}


def test_nan_and_infinity_written_by_python_json_are_values() -> None:
    samples = read(dumps(step=1, loss=float("nan"), up=float("inf"), down=float("-inf")))
    values = tags(samples)
    assert math.isnan(values["loss"])
    assert values["up"] == math.inf
    assert values["down"] == -math.inf


def test_metadata_and_event_records_produce_nothing() -> None:
    meta = dumps(kind="meta", version=1, world_size=8, pid=4242, rank=0)
    other = dumps(type="meta", hidden=64) + dumps(_meta={"v": 1}, step=0, n=1)
    event = dumps(step=10, event="checkpoint saved", path="/ckpt/10")
    assert read(meta + other + event) == []


def test_partial_last_line_is_read_once_complete() -> None:
    decoder = JsonlDecoder()
    line = dumps(step=1, loss=0.5)
    first = decoder.feed(line[:-1], at_eof=True, file_time=FILE_TIME)
    assert (first.consumed, first.samples, first.errors) == (0, [], [])
    second = decoder.feed(line, at_eof=True, file_time=FILE_TIME)
    assert second.consumed == len(line)
    assert second.samples == [Sample("loss", 1, FILE_TIME, 0.5)]


def test_byte_by_byte_feeding_gives_the_same_points_as_one_read() -> None:
    data = b"".join(dumps(step=i, loss=i / 3, nested={"a": i}) for i in range(5))
    data += b"not json\n" + dumps(loss=9) + b'{"step": 99, "loss": 1'
    whole, whole_errors = follow_growing_file(data, [])
    trickled, trickled_errors = follow_growing_file(data, list(range(1, len(data))))
    assert trickled == whole
    assert trickled_errors == whole_errors
    assert len(whole) == 11


def test_invalid_lines_are_skipped_reported_at_their_offset_and_the_rest_is_read() -> None:
    good = dumps(step=1, loss=1)
    bad = [b"{not json\n", b"[1, 2]\n", b'"a string"\n', b"\xff\xfe\x00garbage\n", b"{}}\n"]
    data = good + b"".join(bad) + b"\n   \n" + dumps(step=2, loss=2)
    decoded = JsonlDecoder().feed(data, at_eof=True, file_time=FILE_TIME)
    assert decoded.consumed == len(data)
    assert [s.step for s in decoded.samples] == [1, 2]
    offsets = [len(good) + sum(len(b) for b in bad[:i]) for i in range(len(bad))]
    assert [e.offset for e in decoded.errors] == offsets
    assert all(isinstance(e, DecodeError) and e.message for e in decoded.errors)


def test_an_integer_beyond_float_range_is_reported_not_raised() -> None:
    data = b'{"step": 1, "loss": 1' + b"0" * 400 + b"}\n" + dumps(step=2, loss=2)
    decoded = JsonlDecoder().feed(data, at_eof=True, file_time=FILE_TIME)
    assert [s.step for s in decoded.samples] == [2]
    assert [e.offset for e in decoded.errors] == [0]


def test_crlf_line_ends_and_memoryviews_are_accepted() -> None:
    data = b'{"step": 1, "loss": 1}\r\n{"step": 2, "loss": 2}\r\n'
    decoded = JsonlDecoder().feed(memoryview(data), at_eof=True, file_time=FILE_TIME)
    assert decoded.consumed == len(data)
    assert [s.step for s in decoded.samples] == [1, 2]


def test_a_10_mb_line_is_read_whole_once_its_newline_arrives() -> None:
    big = dumps(step=3, loss=0.5, note="x" * (10 << 20), weights={f"w{i}": i for i in range(1000)})
    data = dumps(step=1, loss=1) + big + dumps(step=4, loss=4)
    decoder = JsonlDecoder()
    head = decoder.feed(data[: len(data) // 2], at_eof=True, file_time=FILE_TIME)
    assert [s.step for s in head.samples] == [1]
    rest = decoder.feed(data[head.consumed :], at_eof=True, file_time=FILE_TIME)
    assert head.consumed + rest.consumed == len(data)
    assert len(rest.samples) == 1 + 1000 + 1
    assert rest.samples[-1] == Sample("loss", 4, FILE_TIME, 4.0)


def test_a_rewritten_file_is_read_from_the_top_as_new() -> None:
    old = JsonlDecoder()
    read(dumps(loss=1) + dumps(loss=2), old)
    fresh = JsonlDecoder()
    fresh.continue_from(old.snapshot())
    assert [s.step for s in read(dumps(loss=7), fresh)] == [0]


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=600)
    | st.lists(
        st.sampled_from(
            [b"{", b"}", b"[", b'"', b"\n", b":", b",", b"1", b"NaN", b'"step"', b"\xff", b"\\"]
        )
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8),
)
def test_binary_garbage_never_raises(data: bytes, cuts: list[int]) -> None:
    cuts = sorted(min(c, len(data)) for c in cuts)
    samples, _ = follow_growing_file(data, cuts)
    assert all(isinstance(s.value, float) and isinstance(s.step, int) for s in samples)
    whole, _ = follow_growing_file(data, [])
    assert repr(samples) == repr(whole)  # repr: NaN values compare unequal


def test_deeply_nested_objects_do_not_exhaust_the_stack() -> None:
    deep = b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"\n"
    nested = b'{"step": 1, "x": ' * 900 + b'{"loss": 1}' + b"}" * 900 + b"\n"
    decoded = JsonlDecoder().feed(deep + nested, at_eof=True, file_time=FILE_TIME)
    assert decoded.consumed == len(deep + nested)
    assert len(decoded.errors) + len(decoded.samples) >= 1


class GeneralOnly(JsonlDecoder):
    """Every line through the general path: the reference for the per-keys plans."""

    def _plan(self, keys: tuple[str, ...]) -> None:
        return None


_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.just(10**400),  # beyond float range: the line is an error, not a crash
    st.booleans(),
    st.none(),
    st.sampled_from(["1.5", "x", "2024-05-01T12:00:00Z", ""]),
    st.sampled_from([1_700_000_123.5, 0.25, 1_700_000_000_000]),  # dates, a duration, ms
    st.dictionaries(st.sampled_from(["a", "b"]), st.floats(allow_nan=False), max_size=2),
)
_KEYS = ["step", "global_step", "time", "timestamp", "loss", "lr", "acc", "kind", "loss/x"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(_KEYS), min_size=1, max_size=6, unique=True),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.tuples(st.integers(0, 2), st.lists(_VALUE, min_size=6, max_size=6)), max_size=12),
)
def test_lines_read_by_their_keys_plan_equal_the_general_path(
    keysets: list[list[str]], lines: list[tuple[int, list[object]]]
) -> None:
    """Most lines repeat their keys, so their reading is planned once per key set;
    whatever the values are (numbers, bools, strings, dates, durations, nested), the
    plan must give the rows, tags, step counter and errors the general path gives."""
    data = b"".join(
        (json.dumps(dict(zip(keysets[k % len(keysets)], values, strict=False))) + "\n").encode()
        for k, values in lines
    )
    fast = JsonlDecoder().feed(data, at_eof=True, file_time=FILE_TIME)
    slow = GeneralOnly().feed(data, at_eof=True, file_time=FILE_TIME)

    def comparable(rows: list) -> list[str]:
        return [repr(row) for row in rows]  # NaN compares by its spelling

    assert comparable(fast.rows) == comparable(slow.rows)
    assert fast.errors == slow.errors


def test_the_probes_meta_record_is_the_runs_trace_and_is_told_again_after_a_restart() -> None:
    import torch

    from trainsentry_probe.meta import meta_record

    record = meta_record(
        run_id="r1", logdir="/logs/exp", rank=0, world_size=1, device=torch.device("cpu"),
        seed=7, hparams={"lr": 0.001, "opt": {"name": "adamw"}, "token": "hf_" + "a" * 30},
        options={"every": 10}, layers=["fc1", "fc2"],
    )  # fmt: skip
    decoder = JsonlDecoder()
    got = decoder.feed(
        (json.dumps(record) + "\n" + json.dumps({"step": 1, "loss": 0.5}) + "\n").encode(),
        at_eof=True,
        file_time=0.0,
    )
    assert len(got.rows) == 1
    assert got.trace["params"] == {"lr": "0.001", "opt/name": "adamw", "token": "****"}
    meta = got.trace["meta"]
    assert (meta["seed"], meta["host"], meta["run_id"], meta["options/every"]) == (
        "7", record["host"], "r1", "10",
    )  # fmt: skip
    assert "layers" not in meta
    resumed = JsonlDecoder()
    resumed.restore(json.loads(json.dumps(decoder.snapshot())))
    assert resumed.feed(b"", at_eof=True, file_time=0.0).trace == got.trace


def test_the_probes_meta_and_end_records_are_marks_with_their_line_numbers() -> None:
    probe = {"format": "trainsentry-probe", "host": "gpu-7", "pid": 4321}
    meta = {"kind": "meta", **probe, "time": 1.8e9, "pid_start": 99, "pid_ns": "pid:[4026531836]"}
    step = {"step": 0, "time": 1.8e9 + 1, "probe/loss": 2.0}
    end = {
        "kind": "end",
        **probe,
        "time": 1.8e9 + 2,
        "exit": "exception",
        "error": "RuntimeError: x",
    }
    other = {"kind": "end", "step": 1, "loss": 1.0}  # another writer's "end" is its business
    decoder = JsonlDecoder()
    first = decoder.feed(
        (json.dumps(meta) + "\n" + json.dumps(step) + "\n").encode(), at_eof=True, file_time=0.0
    )
    second = decoder.feed(
        (json.dumps(other) + "\n" + json.dumps(end) + "\n").encode(), at_eof=True, file_time=0.0
    )
    [started] = first.marks
    assert (started.kind, started.line, started.host, started.pid) == ("meta", 1, "gpu-7", 4321)
    assert (started.pid_start, started.pid_ns) == (99, "pid:[4026531836]")
    [ended] = second.marks
    assert (ended.kind, ended.line, ended.exit, ended.error) == (
        "end",
        4,
        "exception",
        "RuntimeError: x",
    )
    assert [r.tags for r in first.rows + second.rows] == [("probe/loss",), ("loss",)]
    restored = JsonlDecoder()
    restored.restore(decoder.snapshot())
    again = restored.feed((json.dumps(end) + "\n").encode(), at_eof=True, file_time=0.0)
    assert [m.line for m in again.marks] == [5]  # a restart goes on counting
