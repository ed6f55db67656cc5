"""`trainsentry run` in a subprocess for the end-to-end tests, its output collected as it comes.

Stdout is drained by a thread all along: a daemon blocked on a full pipe
could not act on a signal. Point lines (`-vv`) are parsed as they arrive; a
kill -9 may cut the last line, so only complete lines count.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.waiting import WAIT, Deadline
from trainsentry.runtime.restart import Snapshot, SnapshotFile, code_digest


def saved_alert_state(state_dir: Path) -> Snapshot | None:
    """The alert state a daemon of this code saved in `state_dir`, as its restart reads it."""
    return SnapshotFile(state_dir).load(code_digest())


class DaemonProcess:
    def __init__(
        self,
        *args: str,
        merge_stderr: bool = False,
        preexec_fn: Callable[[], object] | None = None,
        module: str = "trainsentry",
        env: dict[str, str] | None = None,
    ) -> None:
        """`module`: what `python -m` runs, `trainsentry` or a wrapper of it."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "run", *args],
            env=env,
            stdout=subprocess.PIPE,
            # merged only where no point lines are parsed: a large stdout write and
            # a stderr line may interleave mid-line in one pipe
            stderr=subprocess.STDOUT if merge_stderr else subprocess.DEVNULL,
            text=True,
            preexec_fn=preexec_fn,
        )
        self.lines: list[str] = []
        self.points: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            with self._changed:
                self.lines.append(text)
                if text.startswith("{") and text.endswith("\n"):
                    self.points.append(json.loads(text))
                self._changed.notify_all()

    def wait_until(
        self, done: Callable[[], bool], timeout: float = WAIT, what: str = "the test's condition"
    ) -> None:
        """Until `done()`, looked at on every output line and every 0.1 s besides (it may
        watch a file, not the output), or fail showing the daemon's last words."""
        deadline = Deadline(timeout)

        def last_words() -> str:
            return f"{what}; the daemon's last lines:\n" + "".join(self.lines[-20:])

        with self._changed:
            while not done():
                self._changed.wait(min(deadline.left(last_words), 0.1))

    def wait_for_points(self, count: int) -> None:
        self.wait_until(lambda: len(self.points) >= count, what=f"{count} points printed")

    def wait_for_text(self, text: str) -> str:
        """The first output line containing `text`, once there is one."""
        self.wait_until(lambda: any(text in line for line in self.lines), what=f"{text!r} printed")
        return next(line for line in self.lines if text in line)

    def stop(self, sig: int = signal.SIGTERM) -> list[dict[str, Any]]:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self._thread.join(timeout=30)
        return self.points

    def clean_output(self) -> str:
        """Everything it printed, once it has stopped: exit status 0 and no traceback."""
        output = "".join(self.lines)
        assert self.proc.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        return output


def live_alerts(alerts: Path, *args: str) -> list[dict[str, Any]]:
    """The transitions `run ARGS --alerts-jsonl ALERTS` writes once it has read all there is."""
    daemon = DaemonProcess(*args, "--http", "off", "--alerts-jsonl", str(alerts), merge_stderr=True)
    try:
        daemon.wait_for_text("caught up")
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, "".join(daemon.lines[-20:])
    return [json.loads(line) for line in alerts.read_text().splitlines()]


def replayed_alerts(*args: str) -> list[dict[str, Any]]:
    """`replay ARGS --format jsonl`, less the "run finished" resolves a live daemon never sends."""
    out = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", *args, "--format", "jsonl"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = [json.loads(line) for line in out.splitlines()]
    return [t for t in found if t.get("reason") != "run finished"]
