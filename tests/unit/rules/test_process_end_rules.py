"""A run's life with the process found writing its files (no probe): watched as the
probe's process is, and ended as runtime/writers.py judged its end, through the
default pack's rules."""

from __future__ import annotations

from trainsentry.point import ProbeMark, TextEvent
from trainsentry.rules.loader import load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.run_life import PROBE, WRITER, Ending, RunProcess

HOST, NS = "gpu-7", "pid:[4026531836]"
FILE = "/logs/plain/metrics.jsonl"
PREFIX = "process 4242 (python train.py) on host gpu-7 "


def engine_with_writer() -> LogEngine:
    engine = LogEngine(load_rules())
    engine.saw("plain", 40, 1000.0)
    process = RunProcess(HOST, 4242, 99, NS, FILE, 0, by=WRITER, command="python train.py")
    engine.writing("plain", process)
    return engine


def test_a_writer_found_is_watched_and_its_run_no_longer_looked_for() -> None:
    engine = engine_with_writer()
    assert [(run, p.pid) for run, p in engine.processes(HOST, NS)] == [("plain", 4242)]
    watched = engine.watching("plain", HOST, NS)
    assert watched is not None and watched.said() == {
        "by": "writer", "pid": 4242, "host": HOST, "command": "python train.py", "file": FILE,
    }  # fmt: skip
    assert engine.unwatched(["plain", "other"]) == ["other"]
    assert engine.processes("another-host", NS) == []


def test_a_writer_killed_pages_as_a_crash_quoting_its_file() -> None:
    engine = engine_with_writer()
    line = PREFIX + "was killed by SIGKILL"
    out = engine.process_gone("plain", FILE, 1010.0, Ending("crashed", line))
    [page] = out
    assert (page.rule, page.severity, page.state) == ("process_exited", "critical", "firing")
    assert page.message == f"{line} ({FILE})"  # no line number: no line of the file said it
    assert page.log == {"path": FILE, "line": 0, "lines": [line]}
    life = engine.life("plain")
    assert life is not None and (life.state, life.cause) == ("crashed", line)
    assert engine.ended == [("plain", life)]
    assert engine.processes(HOST, NS) == []  # an ended run is not watched
    assert engine.process_gone("plain", FILE, 1011.0, Ending("crashed", line)) == []


def test_a_writer_that_exited_cleanly_ends_the_run_finished_with_no_page() -> None:
    engine = engine_with_writer()
    assert engine.process_gone("plain", FILE, 1010.0, Ending("finished")) == []
    life = engine.life("plain")
    assert life is not None and life.told == "finished" and engine.ended


def test_a_writer_gone_with_its_status_unknown_warns_and_the_run_has_exited() -> None:
    engine = engine_with_writer()
    line = PREFIX + "is gone, its exit status unknown"
    [warning] = engine.process_gone("plain", FILE, 1010.0, Ending("exited", line))
    assert (warning.rule, warning.severity) == ("process_gone", "warning")
    life = engine.life("plain")
    assert life is not None and life.ended and life.told == f"exited: {line}"


def test_a_writer_stopped_by_sigterm_warns_and_the_run_is_cancelled() -> None:
    engine = engine_with_writer()
    line = PREFIX + "was stopped by SIGTERM"
    [warning] = engine.process_gone("plain", FILE, 1010.0, Ending("cancelled", line))
    assert (warning.rule, warning.severity) == ("process_stopped", "warning")
    life = engine.life("plain")
    assert life is not None and life.state == "cancelled"


def test_a_writer_gone_long_after_it_wrote_says_nothing_and_is_looked_for_again() -> None:
    engine = engine_with_writer()
    assert engine.process_gone("plain", FILE, 1010.0, Ending("")) == []
    life = engine.life("plain")
    assert life is not None and life.state == "running" and not engine.ended
    assert engine.unwatched(["plain"]) == ["plain"]  # a later process may write it


def test_a_run_its_logs_ended_is_not_watched_so_its_writers_exit_pages_no_one() -> None:
    engine = engine_with_writer()
    done = TextEvent(FILE, 9, 1005.0, ("*** JOB 77 ON n1 CANCELLED AT 2025-01-01T00:00:00 ***",))
    done.run = "plain"
    engine.feed([done])
    assert engine.processes(HOST, NS) == []
    line = PREFIX + "was killed by SIGKILL"
    assert engine.process_gone("plain", FILE, 1010.0, Ending("crashed", line)) == []


def test_the_probe_says_more_than_a_writer_found_in_proc() -> None:
    engine = engine_with_writer()
    meta = ProbeMark(
        "meta", "/logs/plain/trainsentry-probe.jsonl", 1, 1000.0, 0,
        host=HOST, pid=4242, pid_start=99, pid_ns=NS, run="plain",
    )  # fmt: skip
    engine.marked([meta])
    assert [p.by for _, p in engine.processes(HOST, NS)] == [PROBE]
    engine.writing("plain", RunProcess(HOST, 5, 1, NS, FILE, 0, by=WRITER, command="x"))
    assert [p.by for _, p in engine.processes(HOST, NS)] == [PROBE]
    assert engine.unwatched(["plain"]) == []
    end = ProbeMark("end", meta.path, 9, 1010.0, 40, exit="clean", run="plain")
    engine.marked([end])  # the probe's process closed cleanly: no writer left to wait for
    life = engine.life("plain")
    assert life is not None and life.state == "finished"


def test_a_new_process_writing_a_run_its_writer_ended_is_a_restart_at_once() -> None:
    # `python train.py --stage 1 && python train.py --stage 2`, both appending to one log
    engine = engine_with_writer()
    line = PREFIX + "exited with status 3"
    [page] = engine.process_gone("plain", FILE, 1010.0, Ending("crashed", line))
    assert page.rule == "process_exited"
    assert engine.unwatched(["plain"]) == ["plain"]  # looked for again as it grows
    again = RunProcess(HOST, 5151, 120, NS, FILE, 0, by=WRITER, command="python train.py")
    [resolved] = engine.writing("plain", again)
    assert (resolved.rule, resolved.state, resolved.reason) == (
        "process_exited", "resolved", "run restarted",
    )  # fmt: skip
    life = engine.life("plain")
    assert life is not None and life.state == "running"
    assert [p.pid for _, p in engine.processes(HOST, NS)] == [5151]


def test_a_run_its_logs_ended_waits_for_new_data_to_restart_not_a_new_writer() -> None:
    engine = LogEngine(load_rules())
    engine.saw("plain", 40, 1000.0)
    engine.reported("plain", "crashed", "MLflow run status FAILED", 1001.0)
    assert engine.unwatched(["plain"]) == []
    assert engine.writing("plain", RunProcess(HOST, 5, 1, NS, FILE, 0, by=WRITER)) == []
    assert engine.processes(HOST, NS) == []
