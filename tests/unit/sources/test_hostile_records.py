"""Records no writer makes: too large, a step beyond 64 bits, names that would forge output.

Each is skipped and counted or made safe, and the records after it are read.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from trainsentry.sources import names
from trainsentry.sources.base import MAX_RECORD_BYTES
from trainsentry.sources.discover import Root, classify, refusal
from trainsentry.sources.jsonl import JsonlDecoder, as_step
from trainsentry.sources.tail import FileTail
from trainsentry.sources.tfrecord import Framer, encode_record, masked_crc32c


def read_all(path: Path) -> tuple[list[tuple[str, int, float]], list[str]]:
    [log] = Root.watched(path.parent).scan()
    tail = FileTail(log)
    points, errors = [], []
    while True:
        got = tail.read(64 << 20)
        points += [(p.tag, p.step, p.value) for p in got.points]
        errors += got.errors
        if not got.more:
            return points, errors


def test_a_line_over_the_record_limit_is_skipped_once_and_the_next_line_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        f.write('{"step": 1, "loss": 1.0}\n')
        f.write('{"step": 2, "x": "' + "y" * (MAX_RECORD_BYTES + 1000) + '"}\n')
        f.write('{"step": 3, "loss": 3.0}\n')
    points, errors = read_all(path)
    assert points == [("loss", 1, 1.0), ("loss", 3, 3.0)]
    assert len(errors) == 1 and "a line longer than 16 MB" in errors[0]
    assert errors[0].startswith(f"{path}:2: ")  # its line, not its byte offset (25)


def test_a_line_being_skipped_is_still_skipped_after_a_restart() -> None:
    """The skip is in the decoder's snapshot: a restart mid-line does not read its tail."""
    decoder = JsonlDecoder()
    first = decoder.feed(b"{" + b"x" * MAX_RECORD_BYTES, at_eof=True, file_time=0.0)
    assert first.consumed == MAX_RECORD_BYTES + 1 and len(first.errors) == 1
    again = JsonlDecoder()
    again.restore(json.loads(json.dumps(decoder.snapshot())))
    rest = again.feed(b'xxx"}\n{"step": 4, "loss": 4.0}\n', at_eof=True, file_time=0.0)
    assert [r.step for r in rest.rows] == [4] and rest.errors == []


def test_a_log_growing_without_newlines_is_cut_at_the_limit_not_waited_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"z" * (MAX_RECORD_BYTES + 1))  # no newline, ever
    points, errors = read_all(path)
    assert points == [] and len(errors) == 1
    with path.open("ab") as f:  # the line ends at last, and a good one follows
        f.write(b'zz\n{"step": 9, "loss": 9.0}\n')
    points, errors = read_all(path)  # a fresh reader: the line cut again, then the good one
    assert points == [("loss", 9, 9.0)] and len(errors) == 1


def test_a_true_tf_header_announcing_a_record_over_the_limit_is_resynced_past() -> None:
    length = struct.pack("<Q", 200 << 20)
    header = length + struct.pack("<I", masked_crc32c(length))
    good = encode_record(b"next")
    framed = Framer().split(header + b"\x01" * 4096 + good)
    assert [data for _, data in framed.records] == [b"next"]
    assert [e.message for e in framed.errors] == [
        f"a record of {200 << 20} bytes, over the 16 MB record limit: skipped"
    ]


@pytest.mark.parametrize("step", [-(2**63) - 1, 2**63, 10**400, 1e300, "9" * 30])
def test_a_step_beyond_64_bits_is_refused(step: object) -> None:
    with pytest.raises(OverflowError):
        as_step(step)


@pytest.mark.parametrize("step", [10**400, 2**64, 1e300, "9" * 30])
def test_a_json_line_with_a_step_beyond_64_bits_is_a_bad_record(step: object) -> None:
    line = json.dumps({"step": step, "loss": 1.0}).encode() + b'\n{"step": 2, "loss": 2.0}\n'
    decoded = JsonlDecoder().feed(line, at_eof=True, file_time=0.0)
    assert [r.step for r in decoded.rows] == [2]
    assert [e.message for e in decoded.errors] == [
        "number out of range: step outside the 64-bit range"
    ]


def test_names_with_control_characters_are_escaped_and_long_ones_cut_distinctly() -> None:
    assert names.safe_name("lo\x00ss") == "lo\\x00ss"
    assert names.safe_name("run\n\x1b[31mred") == "run\\x0a\\x1b[31mred"
    before = names.cut_names
    a, b = names.safe_name("a" * 1000 + "1"), names.safe_name("a" * 1000 + "2")
    assert len(a) == names.MAX_NAME and a != b and names.cut_names == before + 2
    decoded = JsonlDecoder().feed(b'{"step": 1, "lo\\u0000ss": 1.0}\n', at_eof=True, file_time=0)
    assert decoded.rows[0].tags == ("lo\\x00ss",)


def test_only_regular_files_and_symlinks_inside_the_roots_are_logs(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    (root / "a").mkdir(parents=True)
    os.mkfifo(root / "a" / "pipe.jsonl")
    (tmp_path / "outside.csv").write_text("x\n")
    (root / "a" / "out.csv").symlink_to(tmp_path / "outside.csv")
    (root / "a" / "real.jsonl").write_text("{}\n")
    (root / "a" / "in.jsonl").symlink_to(root / "a" / "real.jsonl")
    inside = os.path.realpath(root)
    assert refusal(str(root / "a" / "pipe.jsonl"), inside).startswith("not a regular file")
    assert "outside the watched roots" in (refusal(str(root / "a" / "out.csv"), inside) or "")
    assert refusal(str(root / "a" / "in.jsonl"), inside) is None
    refused: list[tuple[str, str]] = []
    found, _ = Root.watched(root).walk(refused=refused)
    assert sorted(f.path.name for f in found) == ["in.jsonl", "real.jsonl"]
    assert sorted(Path(p).name for p, _ in refused) == ["out.csv", "pipe.jsonl"]


def test_notes_and_sources_about_event_files_are_not_event_files() -> None:
    assert classify("events.out.tfevents.1700000000.host.1.0") == "tfevents"
    assert classify("events.out.tfevents.1700000000.host.1.0.v2") == "tfevents"
    assert classify("test_tfevents.py") is None and classify("tfevents.md") is None
    assert classify("x_tfevents.jsonl") == "jsonl" and classify("tfevents.csv") == "csv"


def test_test_beside_train_is_the_tf2_tutorials_split_and_alone_a_run(tmp_path: Path) -> None:
    tf2 = tmp_path / "logs" / "gradient_tape" / "20261202-170000"  # the guide's layout
    for split in ("train", "test"):
        (tf2 / split).mkdir(parents=True)
        (tf2 / split / "events.out.tfevents.1.h").write_bytes(b"")
    (tmp_path / "logs" / "other" / "test").mkdir(parents=True)
    (tmp_path / "logs" / "other" / "test" / "metrics.jsonl").write_text("{}\n")
    assert {(f.run, f.tag_prefix) for f in Root.watched(tmp_path / "logs").scan()} == {
        ("gradient_tape/20261202-170000", "train/"),
        ("gradient_tape/20261202-170000", "test/"),
        ("other/test", ""),
    }


def test_train_and_validation_are_keras_splits_only_where_keras_puts_them(
    tmp_path: Path,
) -> None:
    keras = tmp_path / "keras"
    for split in ("train", "validation"):
        (keras / split).mkdir(parents=True)
        (keras / split / "events.out.tfevents.1.h").write_bytes(b"")
    alone = tmp_path / "alone"
    (alone / "train").mkdir(parents=True)
    (alone / "train" / "metrics.jsonl").write_text("{}\n")
    (alone / "eval").mkdir()
    (alone / "eval" / "metrics.jsonl").write_text("{}\n")
    nested = tmp_path / "nested"
    (nested / "exp" / "train").mkdir(parents=True)
    (nested / "exp" / "train" / "metrics.jsonl").write_text("{}\n")
    assert {(f.run, f.tag_prefix) for f in Root.watched(keras).scan()} == {
        ("keras", "train/"), ("keras", "validation/"),
    }  # fmt: skip
    assert {(f.run, f.tag_prefix) for f in Root.watched(alone).scan()} == {
        ("train", ""), ("eval", ""),
    }  # fmt: skip
    assert [(f.run, f.tag_prefix) for f in Root.watched(nested).scan()] == [("exp", "train/")]
    # replay names runs from the path's parent, and splits the same way as the daemon
    assert {(f.run, f.tag_prefix) for f in Root.under(alone, tmp_path).scan()} == {
        ("alone/train", ""), ("alone/eval", ""),
    }  # fmt: skip
    assert {(f.run, f.tag_prefix) for f in Root.under(keras, tmp_path).scan()} == {
        ("keras", "train/"), ("keras", "validation/"),
    }  # fmt: skip
