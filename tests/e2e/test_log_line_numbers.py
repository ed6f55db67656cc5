"""A crash's `path:line` is the log's real line after an over-long line was skipped, after a
progress bar's carriage-return flood, and across a rotation: through the live daemon."""

from __future__ import annotations

from pathlib import Path

from support.alert_log import alerts
from support.daemon_process import DaemonProcess
from support.waiting import wait_until

from trainsentry.sources.base import MAX_RECORD_BYTES

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 40, in <module>',
    "    loss.backward()",
]


def crash(n: int) -> str:
    return "\n".join([*TRACEBACK, f"RuntimeError: bad batch {n}"]) + "\n"


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def paged(out: Path, n: int) -> dict | None:
    return next(
        (a for a in alerts(out) if a["state"] == "firing" and f"bad batch {n}" in a["message"]),
        None,
    )


def test_a_traceback_after_a_skipped_line_a_progress_flood_or_a_rotation_is_cited_at_its_line(
    tmp_path: Path,
) -> None:
    logs, out = tmp_path / "logs", tmp_path / "alerts.jsonl"
    for run in ("skipped", "flood", "rotated"):
        (logs / run).mkdir(parents=True)
        (logs / run / "stdout.log").write_text("hello\n")
    long_line = "x" * (MAX_RECORD_BYTES + 4096) + "\n"
    daemon = DaemonProcess(
        str(logs), "--state-dir", str(tmp_path / "state"), "--http", "off",
        "--alerts-jsonl", str(out), merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        # the case: line 2 over the record limit, the traceback from line 3
        append(logs / "skipped" / "stdout.log", long_line + crash(1))
        wait_until(lambda: paged(out, 1), "the crash after a skipped line paged")
        skipped = daemon.wait_for_text("a line longer than 16 MB")
        # tqdm redrawing one line past the limit, then a crash
        flood = "".join(f"\r{p % 100:3d}%|{'#' * (p % 100 // 10):10s}|" for p in range(10**6))
        assert len(flood) > MAX_RECORD_BYTES
        append(logs / "flood" / "stdout.log", "epoch 1\n" + flood + "\n" + crash(2))
        wait_until(lambda: paged(out, 2), "the crash after the progress flood paged")
        # a line skipped in the old log, then logrotate: renamed away and begun anew
        rotated = logs / "rotated" / "stdout.log"
        append(rotated, long_line + "epoch 2\n")
        wait_until(
            lambda: sum("a line longer than 16 MB" in x for x in daemon.lines) == 3,
            "the old log's long line skipped (the third skip)",
        )
        rotated.rename(logs / "rotated" / "stdout.log.1")
        rotated.write_text("resumed\n" + crash(3))
        wait_until(lambda: paged(out, 3), "the crash in the new log paged")
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, "".join(daemon.lines[-20:])
    assert f"{logs / 'skipped' / 'stdout.log'}:2: a line longer than 16 MB" in skipped, skipped
    for n, run, line in [(1, "skipped", 3), (2, "flood", 4), (3, "rotated", 2)]:
        cited = paged(out, n)
        assert cited is not None
        path = logs / run / "stdout.log"
        assert (cited["log"]["path"], cited["log"]["line"]) == (str(path), line), cited["log"]
        assert path.read_bytes().split(b"\n")[line - 1] == TRACEBACK[0].encode()
