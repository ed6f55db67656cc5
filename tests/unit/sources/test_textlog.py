"""Text logs read as events: real tracebacks from real processes, reports, sniffing by content."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainsentry.point import TextEvent
from trainsentry.sources.discover import Root, classify
from trainsentry.sources.tail import FileTail
from trainsentry.sources.text_scan import PLAIN, plain_events
from trainsentry.sources.textlog import LogDecoder, TextDecoder

CHAINED = """
import torch
def load():
    return torch.load("/nonexistent/ckpt.pt")
try:
    load()
except FileNotFoundError as exc:
    raise ValueError("no checkpoint to resume from") from exc
"""


def stderr_of(script: str) -> bytes:
    """What a real Python process writes to stderr when it dies of `script`."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert done.returncode == 1
    return b"step 1 loss 2.31\n" + done.stderr + b"step 2 never logged\n"


def events_of(data: bytes, chunks: int = 1) -> list[TextEvent]:
    decoder = TextDecoder()
    events: list[TextEvent] = []
    size = max(1, len(data) // chunks)
    pending = b""
    for start in range(0, len(data), size):
        pending += data[start : start + size]
        got = decoder.feed(pending, at_eof=start + size >= len(data), file_time=1.0)
        pending = pending[got.consumed :]
        events += got.events
    return each(events)


def each(events: list[TextEvent]) -> list[TextEvent]:
    """The events with plain lines passed on together as the line events they stand for."""
    return [x for e in events for x in (plain_events(e) if e.kind == PLAIN else [e])]


def test_a_real_chained_traceback_is_one_event_from_its_first_line_to_its_last_exception() -> None:
    events = events_of(stderr_of(CHAINED))
    assert [e.kind for e in events] == ["line", "traceback", "line"]
    crash = events[1]
    assert crash.line == 2 and crash.level == "error"
    assert crash.lines[0] == "Traceback (most recent call last):"
    assert any(x.startswith("FileNotFoundError: [Errno 2]") for x in crash.lines)
    assert "The above exception was the direct cause of the following exception:" in crash.lines
    assert crash.lines[-1] == "ValueError: no checkpoint to resume from"


def test_a_traceback_written_in_pieces_is_still_one_event() -> None:
    data = stderr_of("import torch\ntorch.randn(2, 3) @ torch.randn(4, 5)\n")
    whole = events_of(data)
    assert events_of(data, chunks=7) == whole
    assert whole[1].lines[-1].startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")


def test_a_traceback_cut_by_a_restart_resumes_whole_from_the_snapshot() -> None:
    data = stderr_of("raise KeyError('lr')\n")
    cut = data.index(b"KeyError")
    first = TextDecoder()
    got = first.feed(data[:cut], at_eof=True, file_time=1.0)
    assert [e.kind for e in each(got.events)] == ["line"]  # the frames are held, not let go
    second = TextDecoder()
    second.restore(json.loads(json.dumps(first.snapshot())))
    rest = second.feed(data[got.consumed :], at_eof=True, file_time=1.0).events
    assert rest[0].kind == "traceback" and rest[0].line == 2
    assert rest[0].lines[0] == "Traceback (most recent call last):"
    assert rest[0].lines[-1] == "KeyError: 'lr'"


def test_a_c10d_watchdog_report_with_torchruns_rank_prefix_is_one_event() -> None:
    report = (
        b"[rank1]:[E1016 03:31:38.928019586 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
        b"collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, "
        b"NumelIn=19008, NumelOut=152064, Timeout(ms)=600000) ran for 600071 milliseconds before "
        b"timing out.\n"
        b"[rank1]:[E1016 03:31:38.929246900 ProcessGroupNCCL.cpp:627] [Rank 1] To avoid data "
        b"inconsistency, we are taking the entire process down.\n"
        b"terminate called after throwing an instance of 'c10::DistBackendError'\n"
        b"  what():  [PG 3 Rank 1] Process group watchdog thread terminated with exception\n"
        b"Exception raised from checkTimeout at "
        b"../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 (most recent call first):\n"
        b"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
        b"(0x7f in libc10.so)\n"
        b"\n"
        b"Fatal Python error: Aborted\n"
        b"epoch 3 step 100\n"
    )
    events = events_of(report)
    assert [e.kind for e in events] == ["report", "line"]
    assert len(events[0].lines) == 8 and events[0].lines[-1] == "Fatal Python error: Aborted"


def test_progress_bars_and_colours_are_read_as_a_person_sees_them() -> None:
    data = b"\x1b[32mok\x1b[0m\n 10%|#   | 1/10\r 20%|##  | 2/10\r\n\n"
    assert [e.lines for e in events_of(data)] == [("ok",), (" 20%|##  | 2/10",)]


def test_secrets_in_a_log_line_are_masked_before_the_event_is_made() -> None:
    line = b"push to https://bob:hunter2@hub.example/x with hf_AbCdEfGhIjKlMnOpQrStUvWx\n"
    [event] = events_of(line)
    assert event.lines == ("push to https://bob:****@hub.example/x with hf_****",)


def test_a_log_whose_first_line_is_a_csv_header_is_read_as_keras_csvlogger_writes_it() -> None:
    decoder = LogDecoder()
    got = decoder.feed(b"epoch,accuracy,loss\n0,0.51,0.70\n1,0.62,0.55\n", at_eof=True, file_time=1)
    assert decoder.mode == "csv" and not got.events
    assert [(r.step, r.tags, r.values) for r in got.rows][1] == (
        1,
        ("accuracy", "loss"),
        (0.62, 0.55),
    )


def test_a_log_of_json_lines_gives_its_metrics_and_its_records_as_events() -> None:
    records = [
        {"step": 10, "loss": 0.5},
        {"levelname": "INFO", "message": "saved checkpoint"},
        {"levelname": "ERROR", "message": "upload failed", "exc_info": "Traceback ...\nOSError: x"},
    ]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    decoder = LogDecoder()
    got = decoder.feed(data, at_eof=True, file_time=1.0)
    assert decoder.mode == "jsonl"
    assert [(r.step, r.tags) for r in got.rows] == [(10, ("loss",))]
    assert [(e.line, e.level, e.lines) for e in got.events] == [
        (2, "info", ("INFO saved checkpoint",)),
        (3, "error", ("ERROR upload failed", "Traceback ...", "OSError: x")),
    ]


@pytest.mark.parametrize(
    "name", ["train.log", "slurm-4242.out", "slurm-4242.err", "stdout.log", "output.log"]
)
def test_the_files_jobs_stdout_and_stderr_land_in_are_text_logs(name: str) -> None:
    assert classify(name) == "text"


def test_a_text_log_in_a_run_directory_belongs_to_that_run(tmp_path: Path) -> None:
    run = tmp_path / "exp1" / "attempt_0" / "0"
    run.mkdir(parents=True)
    (run / "stderr.log").write_bytes(stderr_of("raise SystemExit(1) if False else 1/0\n"))
    [found] = Root.watched(tmp_path).scan()
    assert (found.kind, found.run) == ("text", "exp1/attempt_0/0")
    got = FileTail(found).read()
    assert {e.run for e in got.events} == {"exp1/attempt_0/0"}
    assert got.events[1].path == str(run / "stderr.log")
    assert got.events[1].lines[-1] == "ZeroDivisionError: division by zero"


def test_a_log_named_after_a_run_directory_beside_it_belongs_to_that_run(tmp_path: Path) -> None:
    # `#SBATCH --output=logs/%x.out` beside the job's `logs/%x/`: Slurm's output is that run's
    (tmp_path / "exp1").mkdir()
    (tmp_path / "exp1" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (tmp_path / "exp1.out").write_text("slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT x ***\n")
    (tmp_path / "slurm-77.out").write_text("a job of no run of its own\n")
    found = {f.path.name: f.run for f in Root.watched(tmp_path).scan()}
    assert found == {"exp1.out": "exp1", "metrics.jsonl": "exp1", "slurm-77.out": tmp_path.name}


# A real chain of three: `During handling` and `direct cause` both, as torch raises it.
THREE_CHAINED = """
import torch
def step():
    return torch.randn(2, 3) @ torch.randn(4, 5)
try:
    try:
        step()
    except RuntimeError:
        {}["lr"]
except KeyError as exc:
    raise ValueError("resume failed") from exc
"""


@pytest.mark.parametrize(
    "marker", [b"\nDuring handling", b"\nThe above exception", b"\nValueError"]
)
def test_a_chained_traceback_split_between_two_reads_is_one_event(marker: bytes) -> None:
    data = stderr_of(THREE_CHAINED)
    data = data[: data.rindex(b"step 2 never logged")]  # the crash's last words are its own
    cut = data.index(marker) + 1
    decoder = TextDecoder()
    first = decoder.feed(data[:cut], at_eof=True, file_time=1.0).events
    assert decoder.holding  # the exception line before the cut may be continued
    second = decoder.feed(data[cut:], at_eof=True, file_time=2.0).events
    held = decoder.let_go()  # nothing follows: the log went quiet
    events = each(first + second + held)
    assert [e.kind for e in events] == ["line", "traceback"]
    crash = events[1]
    assert crash.lines[0] == "Traceback (most recent call last):"
    assert crash.lines[-1] == "ValueError: resume failed"
    assert any(x.startswith("RuntimeError: mat1 and mat2 shapes") for x in crash.lines)
    assert "KeyError: 'lr'" in crash.lines
    assert crash.wall_time == 2.0  # when its last lines were read
    assert not decoder.holding and decoder.let_go() == []


def test_the_last_traceback_of_a_finished_log_is_let_go_by_replay(tmp_path: Path) -> None:
    from trainsentry.sources.reading import iter_events

    run = tmp_path / "exp"
    run.mkdir()
    data = stderr_of(CHAINED)
    (run / "stderr.log").write_bytes(data[: data.rindex(b"step 2 never logged")])
    events = each(list(iter_events([run])))
    assert [e.kind for e in events] == ["line", "traceback"]
    assert events[1].lines[-1] == "ValueError: no checkpoint to resume from"


def test_a_log_of_many_ranks_gives_each_rank_its_own_events(tmp_path: Path) -> None:
    """A Slurm job's output holds every rank's lines; torch.distributed prefixes an uncaught
    exception's lines with `[rank<N>]:` (its excepthook): each rank's crash is its run's."""
    crash = subprocess.run(
        [sys.executable, "-c", "raise RuntimeError('Timed out waiting 10000ms for recv')"],
        capture_output=True,
        text=True,
    ).stderr
    prefixed = "".join(f"[rank2]: {line}\n" for line in crash.splitlines())
    (tmp_path / "exp").mkdir()
    log = tmp_path / "exp" / "slurm-77.out"
    log.write_text("step 1 loss 2.3\n" + prefixed + "[rank0]: waiting\nsrun: error: node3\n")
    found = [f for f in Root.watched(tmp_path).scan() if f.path == log]
    tail = FileTail(found[0])
    got = tail.read()
    got.events.extend(tail.let_go())
    runs = [(e.run, e.kind) for e in each(got.events)]
    assert runs == [
        ("exp", "line"),
        ("exp/rank2", "traceback"),
        ("exp/rank0", "line"),
        ("exp", "line"),
    ]
    assert tail.runs == {"exp", "exp/rank0", "exp/rank2"}


def test_a_ranks_own_log_keeps_its_events(tmp_path: Path) -> None:
    """torchrun's per-rank stderr.log is rank 3's already: a `[rank3]:` line stays there."""
    directory = tmp_path / "j_k2j4h5g6" / "attempt_0" / "3"
    directory.mkdir(parents=True)
    (directory / "stderr.log").write_text("[rank3]: RuntimeError: boom\n")
    [found] = Root.watched(tmp_path).scan()
    got = FileTail(found).read()
    assert [e.run for e in got.events] == ["j_k2j4h5g6/attempt_0/3"]
