"""W&B's run-<id>.wandb decoded against a file written by the real wandb, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.trackers import expected

from trainsentry.point import Row
from trainsentry.sources.base import DecodeError
from trainsentry.sources.wandb_records import BLOCK, HEADER_LEN, WandbDecoder, run_name


@pytest.fixture(scope="module")
def run_file(tracker_stores: dict[str, Path]) -> bytes:
    directory = tracker_stores["wandb"]
    run_dir = Path(expected(directory)["run_dir"])
    (found,) = run_dir.glob("run-*.wandb")
    return found.read_bytes()


def feed(data: bytes, chunk: int) -> tuple[list[Row], list[DecodeError], int]:
    """As the tail feeds a decoder: unconsumed bytes are handed again, longer."""
    decoder = WandbDecoder()
    rows: list[Row] = []
    errors: list[DecodeError] = []
    offset, end = 0, 0
    while end < len(data):
        end = min(len(data), end + chunk)
        got = decoder.feed(data[offset:end], at_eof=True, file_time=0.0)
        rows += got.rows
        errors += got.errors
        offset += got.consumed
    return rows, errors, offset


def test_the_history_rows_of_a_real_run_are_its_logged_steps(run_file: bytes) -> None:
    rows, errors, consumed = feed(run_file, len(run_file))
    assert (errors, consumed) == ([], len(run_file))
    assert [r.step for r in rows] == list(range(260))
    assert {t for r in rows for t in r.tags} == {
        "train/loss",
        "train/grad_norm",
        "train/learning_rate",
    }


def test_a_file_fed_in_small_pieces_gives_the_rows_of_the_whole(run_file: bytes) -> None:
    whole = feed(run_file, len(run_file))[0]
    for chunk in (7, 1000, BLOCK - 3):
        assert repr(feed(run_file, chunk)[0]) == repr(whole)  # repr: NaN equals NaN


def test_a_partial_last_record_is_waited_for(run_file: bytes) -> None:
    cut = run_file[: len(run_file) - 5]
    rows, errors, consumed = feed(cut, len(cut))
    assert errors == []
    assert consumed < len(cut)
    assert len(rows) <= 260


def test_a_damaged_record_costs_its_block_with_one_error(run_file: bytes) -> None:
    assert len(run_file) > 2 * BLOCK, "the run must span blocks"
    damaged = bytearray(run_file)
    damaged[BLOCK + 200] ^= 0xFF
    rows, errors, consumed = feed(bytes(damaged), len(damaged))
    whole = feed(run_file, len(run_file))[0]
    assert len(errors) == 1 and "skipped to the next 32 KiB block" in errors[0].message
    assert consumed == len(run_file)
    assert 0 < len(rows) < len(whole)
    assert repr(rows[-1]) == repr(whole[-1])


def test_a_file_of_a_newer_format_version_is_said_once_and_not_read(run_file: bytes) -> None:
    newer = run_file[:6] + b"\x01" + run_file[7:]
    rows, errors, consumed = feed(newer, 4096)
    assert rows == []
    assert [e.message for e in errors] == [
        "a .wandb file of header version 1 (this trainsentry reads 0): not read"
    ]
    assert consumed == len(newer)


def test_a_run_is_named_by_its_run_record_once_that_is_written(
    run_file: bytes, tmp_path: Path
) -> None:
    path = tmp_path / "run-x.wandb"
    path.write_bytes(run_file[:HEADER_LEN])  # wandb-core's file before its first block
    assert run_name(path) is None
    path.write_bytes(run_file)
    named = run_name(path)
    assert named is not None and named.startswith("trackers/diverge-")
    path.write_bytes(b"no W&B header at all")
    assert run_name(path) == ""  # the decoder says why; the run is named by its directory


def test_a_restarted_decoder_says_the_runs_trace_and_end_again(run_file: bytes) -> None:
    first = WandbDecoder()
    told = first.feed(run_file, at_eof=True, file_time=5.0)
    assert told.trace["run"]["name"] == "diverge" and told.ends[0].state == "finished"
    resumed = WandbDecoder()
    resumed.restore(first.snapshot())
    again = resumed.feed(b"", at_eof=True, file_time=6.0)
    assert (again.trace, again.ends) == (told.trace, told.ends)
