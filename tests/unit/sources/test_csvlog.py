"""The CSV decoder against Lightning's and Keras' CSVLogger, fed the way the tailer feeds it."""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import Sample
from trainsentry.sources.csvlog import CsvDecoder
from trainsentry.sources.discover import Root
from trainsentry.sources.tail import FileTail

FILE_TIME = 1_700_000_000.0
HEAD = 64  # what the tailer compares to tell a rewrite from an append


class Follower:
    """The tailer reduced to the decoder contract: whole-file reads, rewrite detection."""

    def __init__(self) -> None:
        self.decoder = CsvDecoder()
        self.offset = 0
        self.head = b""
        self.samples: list[Sample] = []
        self.errors: list[str] = []

    def see(self, content: bytes) -> None:
        if len(content) < self.offset or content[: len(self.head)] != self.head:
            previous = json.loads(json.dumps(self.decoder.snapshot()))
            self.decoder = CsvDecoder()
            self.decoder.continue_from(previous)
            self.offset = 0
        self.head = content[:HEAD]
        decoded = self.decoder.feed(content[self.offset :], at_eof=True, file_time=FILE_TIME)
        self.offset += decoded.consumed
        self.samples += decoded.samples
        self.errors += [e.message for e in decoded.errors]


def read(data: bytes, decoder: CsvDecoder | None = None) -> list[Sample]:
    decoded = (decoder or CsvDecoder()).feed(data, at_eof=True, file_time=FILE_TIME)
    assert decoded.errors == []
    return decoded.samples


def points(samples: list[Sample]) -> list[tuple[str, int, float]]:
    return [(s.tag, s.step, s.value) for s in samples]


def lightning_versions(logger_cls: Any, root: Path) -> list[bytes]:
    """metrics.csv after each save() of a run whose metrics appear over time."""
    logger = logger_cls(str(root), name="exp", version=0, flush_logs_every_n_steps=10**9)
    path = Path(logger.log_dir) / "metrics.csv"
    versions = []
    for step in range(12):
        metrics: dict[str, float] = {"train_loss": 2.0 - step / 10, "epoch": step // 4}
        if step >= 3:
            metrics["lr"] = 0.1 / (step + 1)  # first appears at step 3: header rewrite
        logger.log_metrics(metrics, step=step)
        if step % 4 == 3:
            logger.log_metrics({"val_loss": 1.0 + step / 100, "epoch": step // 4}, step=step)
        if step >= 8:
            logger.log_metrics({"zz_grad_norm": float(step)}, step=step)  # a second rewrite
        if step % 2:
            logger.save()
            versions.append(path.read_bytes())
    return versions


@functools.cache
def fabric_versions() -> list[bytes]:
    from lightning.fabric.loggers import CSVLogger

    with tempfile.TemporaryDirectory() as tmp:
        return lightning_versions(CSVLogger, Path(tmp))


def test_lightning_csvlogger_rows_become_points_with_epoch_as_a_series(tmp_path: Path) -> None:
    loggers = pytest.importorskip("lightning.pytorch.loggers")
    final = lightning_versions(loggers.CSVLogger, tmp_path)[-1]
    assert final.startswith(b"epoch,lr,step,train_loss,val_loss,zz_grad_norm\r\n")
    got = points(read(final))
    assert ("train_loss", 0, 2.0) in got
    assert ("epoch", 7, 1.0) in got
    assert ("val_loss", 7, 1.07) in got
    assert ("lr", 3, 0.025) in got
    assert not any(tag == "step" for tag, _, _ in got)
    assert {s.wall_time for s in read(final)} == {FILE_TIME}  # Lightning writes no time


def test_lightning_header_growth_via_rewrite_emits_every_point_exactly_once() -> None:
    pytest.importorskip("lightning.fabric")
    versions = fabric_versions()
    follower = Follower()
    for content in versions:
        follower.see(content)
    assert points(follower.samples) == points(read(versions[-1]))
    assert follower.errors == []


@settings(max_examples=150, deadline=None)
@given(observations=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans())))
def test_a_rewrite_caught_half_written_still_emits_every_point_once(
    observations: list[tuple[float, float, bool]],
) -> None:
    """The tailer may read at any moment: mid-rewrite, mid-row, or mid-header."""
    pytest.importorskip("lightning.fabric")
    versions = fabric_versions()
    follower = Follower()
    previous = b""
    for index, content in enumerate(versions):
        appended = content.startswith(previous)
        low = len(previous) if appended else 0  # a rewrite starts again from empty
        a, b, whole = observations[index] if index < len(observations) else (1, 1, True)
        for fraction in sorted((a, b)):
            follower.see(content[: low + int(fraction * (len(content) - low))])
        if whole or index == len(versions) - 1:
            follower.see(content)
        previous = content if whole else content[: low + int(max(a, b) * (len(content) - low))]
    assert points(follower.samples) == points(read(versions[-1]))
    assert follower.errors == []


def test_the_real_tailer_follows_a_lightning_rewrite_without_duplicates(tmp_path: Path) -> None:
    fabric = pytest.importorskip("lightning.fabric.loggers")
    logger = fabric.CSVLogger(str(tmp_path), name="exp", version=0, flush_logs_every_n_steps=10**9)
    path = Path(logger.log_dir) / "metrics.csv"
    got = []
    tail: FileTail | None = None
    for step in range(6):
        metrics = {"loss": float(step)} | ({"acc": step / 10} if step >= 2 else {})
        logger.log_metrics(metrics, step=step)
        logger.save()
        if tail is None:
            log = Root.watched(tmp_path).describe(path)
            assert log is not None
            tail = FileTail(log)
        got += [(p.tag, p.step, p.value) for p in tail.read().points]
    assert tail is not None
    tail.close()
    assert got == points(read(path.read_bytes()))
    assert len(got) == 6 + 4


def test_the_real_tailer_follows_a_rewrite_past_the_first_64_bytes(tmp_path: Path) -> None:
    fabric = pytest.importorskip("lightning.fabric.loggers")
    logger = fabric.CSVLogger(str(tmp_path), name="exp", version=0, flush_logs_every_n_steps=10**9)
    path = Path(logger.log_dir) / "metrics.csv"
    base = {"epoch": 0, "grad_norm_total": 1.0, "lr-AdamW": 0.1, "train_acc_step": 0.5}
    base |= {"train_loss_step": 2.0}
    got = []
    tail: FileTail | None = None
    for step in range(6):
        logger.log_metrics(base | ({"val_loss": 1.0} if step >= 3 else {}), step=step)
        logger.save()
        if tail is None:
            log = Root.watched(tmp_path).describe(path)
            assert log is not None
            tail = FileTail(log)
        got += [(p.tag, p.step, p.value) for p in tail.read().points]
    assert tail is not None
    tail.close()
    assert path.read_bytes().index(b"val_loss") > 64
    assert got == points(read(path.read_bytes()))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # keras/numpy 2 noise
def test_keras_csvlogger_epochs_are_steps_and_na_cells_are_no_point(tmp_path: Path) -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    import numpy as np

    path = tmp_path / "training.log.csv"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 1), "float32")
    model.fit(
        x,
        y,
        epochs=4,
        verbose=0,
        validation_data=(x, y),
        validation_freq=2,  # no val_loss at epochs 0 and 2: Keras writes NA
        callbacks=[keras.callbacks.CSVLogger(str(path))],
    )
    samples = read(path.read_bytes())
    assert [s.step for s in samples if s.tag == "loss"] == [0, 1, 2, 3]
    assert [s.step for s in samples if s.tag == "val_loss"] == [1, 3]
    assert "epoch" not in {s.tag for s in samples}


def test_keras_on_epoch_end_with_a_separator_nan_and_a_list_value(tmp_path: Path) -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    path = tmp_path / "log.csv"
    logger = keras.callbacks.CSVLogger(str(path), separator=";")
    logger.on_train_begin()
    logger.on_epoch_end(0, {"loss": 1.5, "acc": 0.5, "val_loss": 1.7, "val_acc": 0.4})
    logger.on_epoch_end(1, {"loss": float("nan"), "acc": [0.1, 0.2], "val_loss": 1.6})
    logger.on_train_end()
    decoded = CsvDecoder().feed(path.read_bytes(), at_eof=True, file_time=FILE_TIME)
    got = {(s.tag, s.step): s.value for s in decoded.samples}
    assert got[("loss", 0)] == 1.5 and got[("val_acc", 0)] == 0.4
    assert math.isnan(got[("loss", 1)])
    assert ("acc", 1) not in got and ("val_acc", 1) not in got
    assert len(decoded.errors) == 1 and "'acc'" in decoded.errors[0].message


def test_a_rewrite_by_a_restarted_job_is_read_as_a_new_file() -> None:
    follower = Follower()
    follower.see(b"epoch,loss\r\n0,2.0\r\n1,1.5\r\n")
    follower.see(b"epoch,loss\r\n0,2.1\r\n")  # Keras reopened the file with "w"
    assert points(follower.samples) == [("loss", 0, 2.0), ("loss", 1, 1.5), ("loss", 0, 2.1)]


def test_a_rewrite_that_changed_delivered_rows_is_reported() -> None:
    follower = Follower()
    follower.see(b"loss,step\n1.0,0\n2.0,1\n3.0,2\n")
    follower.see(b"acc,loss,step\n,1.0,0\n,2.0,1\n,3.5,2\n0.5,4.0,3\n")
    assert points(follower.samples)[-2:] == [("acc", 3, 0.5), ("loss", 3, 4.0)]
    assert len(follower.errors) == 1 and "row 3" in follower.errors[0]


def test_header_not_yet_complete_waits() -> None:
    decoder = CsvDecoder()
    data = b"step,loss,val_loss\n0,1.0,\n"
    first = decoder.feed(data[:10], at_eof=True, file_time=FILE_TIME)
    assert (first.consumed, first.samples) == (0, [])
    assert points(read(data, decoder)) == [("loss", 0, 1.0)]


def test_partial_row_is_read_once_complete() -> None:
    decoder = CsvDecoder()
    data = b"step,loss\n0,1.0\n1,2.5"
    first = decoder.feed(data, at_eof=True, file_time=FILE_TIME)
    assert points(first.samples) == [("loss", 0, 1.0)]
    rest = decoder.feed(data[first.consumed :] + b"0\n", at_eof=True, file_time=FILE_TIME)
    assert points(rest.samples) == [("loss", 1, 2.5)]


def test_byte_by_byte_feeding_gives_the_same_points_as_one_read() -> None:
    data = b'\xef\xbb\xbfepoch,"loss, total",step,bad\r\n0,1.0,0,x\r\n,"2.0",1,\r\n1,3.0,2\r\n'
    data += b"1,,3,y\r\n2,4.0,4"
    whole = CsvDecoder().feed(data, at_eof=True, file_time=FILE_TIME)
    decoder, offset, samples, errors = CsvDecoder(), 0, [], []
    for size in range(1, len(data) + 1):
        decoded = decoder.feed(data[offset:size], at_eof=True, file_time=FILE_TIME)
        samples += decoded.samples
        errors += [(offset + e.offset, e.message) for e in decoded.errors]
        offset += decoded.consumed
    assert samples == whole.samples
    assert errors == [(e.offset, e.message) for e in whole.errors]
    assert ("loss, total", 1, 2.0) in points(samples)


def test_bad_rows_are_skipped_and_a_bad_column_is_reported_once() -> None:
    data = b"step,loss,note\n0,1.0,a\n1,2.0\n2,3.0,b,extra\n3,4.0,c\n4,5.0,1e-3\n"
    decoded = CsvDecoder().feed(data, at_eof=True, file_time=FILE_TIME)
    assert points(decoded.samples) == [
        ("loss", 0, 1.0),
        ("loss", 3, 4.0),
        ("loss", 4, 5.0),
        ("note", 4, 1e-3),
    ]
    messages = [e.message for e in decoded.errors]
    assert len(messages) == 3  # two malformed rows, one non-numeric column
    assert [e.offset for e in decoded.errors] == [
        data.index(b"0,1.0,a"),
        *[data.index(row) for row in (b"1,2.0\n", b"2,3.0,b")],
    ]


def test_a_time_column_is_the_wall_time_else_file_time() -> None:
    data = b"step,loss,timestamp\n0,1.0,1750000000.5\n1,2.0,2025-06-15T12:00:00Z\n2,3.0,\n"
    assert [s.wall_time for s in read(data)] == [1750000000.5, 1749988800.0, FILE_TIME]


def test_a_file_without_a_step_or_epoch_column_is_numbered_by_row() -> None:
    assert points(read(b"loss\n1\n2\n")) == [("loss", 0, 1.0), ("loss", 1, 2.0)]


def test_a_corrupt_snapshot_restores_a_fresh_decoder() -> None:
    decoder = CsvDecoder()
    decoder.restore({"header": 5, "rows": "many"})
    assert points(read(b"step,loss\n0,1\n", decoder)) == [("loss", 0, 1.0)]


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=400)
    | st.lists(
        st.sampled_from([b",", b'"', b"\n", b"\r\n", b"step", b"1", b"nan", b"x", b";", b"\xff"])
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    rewrite=st.booleans(),
)
def test_binary_garbage_never_raises(data: bytes, cuts: list[int], rewrite: bool) -> None:
    decoder, offset = CsvDecoder(), 0
    if rewrite:
        decoder.continue_from({"header": ["step", "x"], "delivered": 2, "first": {"x": "1"}})
    for size in [*sorted(min(c, len(data)) for c in cuts), len(data)]:
        decoded = decoder.feed(data[offset:size], at_eof=True, file_time=FILE_TIME)
        assert 0 <= decoded.consumed <= size - offset
        offset += decoded.consumed
        state = json.loads(json.dumps(decoder.snapshot()))
        decoder = CsvDecoder()
        decoder.restore(state)
