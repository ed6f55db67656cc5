"""Non-finite values as loggers write them: `str(value)` words, and the `null` that orjson,
pandas and JavaScript write for a NaN, read from files those writers wrote."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import orjson
import pandas as pd

from trainsentry.point import Sample
from trainsentry.sources.csvlog import CsvDecoder
from trainsentry.sources.jsonl import JsonlDecoder, non_finite_word

FILE_TIME = 1_700_000_000.0
NAN, INF = float("nan"), float("inf")


def read(path: Path, decoder: JsonlDecoder | CsvDecoder | None = None) -> list[Sample]:
    decoded = (decoder or JsonlDecoder()).feed(path.read_bytes(), at_eof=True, file_time=FILE_TIME)
    assert decoded.errors == []
    return decoded.samples


def series(samples: list[Sample], tag: str) -> list[tuple[int, str]]:
    """(step, value) of one tag, the value spelt so that NaN compares."""
    return [(s.step, repr(s.value)) for s in samples if s.tag == tag]


def test_the_words_str_writes_for_non_finite_floats_are_those_floats(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    values = [1.5, NAN, INF, -INF]
    with path.open("w") as f:  # a logger that writes str(value)
        for step, value in enumerate(values):
            f.write(json.dumps({"step": step, "loss": str(value)}) + "\n")
    assert series(read(path), "loss") == [(1, "nan"), (2, "inf"), (3, "-inf")]


def test_every_case_and_sign_of_the_words_is_read_and_nothing_else_is() -> None:
    for word in ("NaN", "nan", "-nan", "+NAN", "Infinity", "-Infinity", "+inf", "INF", "-iNf"):
        assert non_finite_word(word) is not None, word
        assert repr(non_finite_word(word)) == repr(float(word)), word
    for word in ("1.5", "", "x", "nanx", " nan", "infinite", "None", "null", "-", "n"):
        assert non_finite_word(word) is None, word


def test_other_strings_stay_no_values_and_step_words_are_no_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        json.dumps({"step": 1, "loss": "0.5", "name": "run", "acc": 0.9}) + "\n"
        + json.dumps({"step": "nan", "loss": "inf"}) + "\n"
    )  # fmt: skip
    got = {(s.step, s.tag): repr(s.value) for s in read(path)}
    assert got == {(1, "acc"): "0.9", (0, "loss"): "inf"}  # a step of "nan" is no step


def test_orjsons_null_for_a_nan_is_a_nan_once_the_series_held_numbers(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [(0, 2.0, 0.1), (1, 1.9, 0.1), (2, NAN, 0.1), (3, INF, NAN)]
    path.write_bytes(
        b"".join(orjson.dumps({"step": s, "loss": v, "lr": lr}) + b"\n" for s, v, lr in rows)
    )
    assert b'"loss":null' in path.read_bytes()  # what orjson writes for NaN and inf
    samples = read(path)
    assert series(samples, "loss") == [(0, "2.0"), (1, "1.9"), (2, "nan"), (3, "nan")]
    assert series(samples, "lr") == [(0, "0.1"), (1, "0.1"), (2, "0.1"), (3, "nan")]


def test_a_series_null_from_its_first_point_stays_ignored(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1.0, "val_loss": None} for s in range(3)]
    rows.append({"step": 3, "loss": 1.0, "val_loss": 0.5})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    samples = read(path)
    assert series(samples, "val_loss") == [(3, "0.5")]


def test_pandas_dense_frame_writes_a_nan_as_null_and_it_is_read_as_nan(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    frame = pd.DataFrame({"step": [0, 1, 2], "loss": [1.0, 0.9, NAN], "lr": [0.1, 0.1, 0.1]})
    frame.to_json(path, orient="records", lines=True)
    assert '"loss":null' in path.read_text()
    assert series(read(path), "loss") == [(0, "1.0"), (1, "0.9"), (2, "nan")]


def hf_log_history(nan_at: int | None) -> list[dict[str, float]]:
    """HF Trainer's `state.log_history`: training rows and eval rows, each of its own keys."""
    history: list[dict[str, float]] = []
    for step in range(10, 110, 10):
        loss = NAN if step == nan_at else 2.0 - step / 100
        history.append(
            {
                "loss": loss,
                "grad_norm": 1.5,
                "learning_rate": 1e-4,
                "epoch": step / 100,
                "step": step,
            }
        )
        if step % 30 == 0:
            history.append(
                {"eval_loss": 1.8, "eval_runtime": 2.5, "epoch": step / 100, "step": step}
            )
    return history


def test_pandas_sparse_frames_empty_cells_are_no_points(tmp_path: Path) -> None:
    """HF's log_history as a DataFrame: eval rows have `loss: null`, training rows
    `eval_loss: null`; those are cells no one logged, not NaNs."""
    path = tmp_path / "log_history.jsonl"
    pd.DataFrame(hf_log_history(nan_at=None)).to_json(path, orient="records", lines=True)
    assert '"loss":null' in path.read_text() and '"eval_loss":null' in path.read_text()
    samples = read(path)
    assert not [s for s in samples if math.isnan(s.value)]
    assert len(series(samples, "eval_loss")) == 3
    assert len(series(samples, "loss")) == 10


def test_a_nan_loss_in_a_sparse_frame_is_still_a_nan(tmp_path: Path) -> None:
    path = tmp_path / "log_history.jsonl"
    pd.DataFrame(hf_log_history(nan_at=70)).to_json(path, orient="records", lines=True)
    samples = read(path)
    assert [(s.step, s.tag) for s in samples if math.isnan(s.value)] == [(70, "loss")]


def test_the_verdict_on_a_kind_of_line_survives_a_restart(tmp_path: Path) -> None:
    """Training rows (eval_loss null) came first, so their nulls are missing cells; after
    a restart the same rows must not turn NaN now that eval_loss has held numbers."""
    path = tmp_path / "log_history.jsonl"
    pd.DataFrame(hf_log_history(nan_at=None)).to_json(path, orient="records", lines=True)
    lines = path.read_bytes().splitlines(keepends=True)
    first = JsonlDecoder()
    first.feed(b"".join(lines[:6]), at_eof=True, file_time=FILE_TIME)
    resumed = JsonlDecoder()
    resumed.restore(json.loads(json.dumps(first.snapshot())))
    decoded = resumed.feed(b"".join(lines[6:]), at_eof=True, file_time=FILE_TIME)
    assert not [s for s in decoded.samples if math.isnan(s.value)]
    assert (
        resumed.feed(
            orjson.dumps(
                {"loss": None, "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": 2.0, "step": 200}
            )
            + b"\n",
            at_eof=True,
            file_time=FILE_TIME,
        )
        .samples[-1]
        .tag
        == "loss"
    )


def test_nested_words_and_nulls_are_read_as_top_level_ones(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "train": {"loss": 1.0}}, {"step": 1, "train": {"loss": None}}]
    rows.append({"step": 2, "train": {"loss": "-Infinity"}})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert series(read(path), "train/loss") == [(0, "1.0"), (1, "nan"), (2, "-inf")]


def test_csv_cells_of_the_words_are_those_floats_and_empty_cells_no_points(
    tmp_path: Path,
) -> None:
    """Lightning's and Keras' CSVLoggers write `str(value)` through the csv module: `nan`,
    `inf`; an empty or `NA` cell is a metric not logged on that row."""
    path = tmp_path / "metrics.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "loss", "val_loss"])
        out.writerows([[0, 1.0, ""], [1, NAN, "NA"], [2, INF, 0.5], [3, "-Infinity", "NaN"]])
    samples = read(path, CsvDecoder())
    assert series(samples, "loss") == [(0, "1.0"), (1, "nan"), (2, "inf"), (3, "-inf")]
    assert series(samples, "val_loss") == [(2, "0.5"), (3, "nan")]
