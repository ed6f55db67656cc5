"""A `trainsentry` command in a real pseudo-terminal, its screen output read as it comes.

What a person sees depends on the output being a terminal (rich tables and
colour there, plain lines in a pipe), so these tests give the real command a
pty rather than pretending with isatty(). The window is fixed at 120x40 so
that wrapping is the same on every machine.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

COLUMNS, LINES = 120, 40
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """The text without its escape sequences: what the screen reads."""
    return ESCAPE.sub("", text)


def screen_lines(text: str) -> list[str]:
    """The lines left on screen, as a terminal draws them: carriage returns overdraw,
    `ESC[2K` erases the line, `ESC[nA` moves up; other escapes (colour) draw nothing."""
    lines, row, col = [""], 0, 0
    for token in re.split(r"(\r|\n|\x1b\[[0-9;?]*[A-Za-z])", text):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token.startswith("\x1b[") and token.endswith("A"):
            row = max(0, row - int(token[2:-1] or 1))
        elif token and not token.startswith("\x1b["):
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines]


class PtyProcess:
    def __init__(
        self, *args: str, env: dict[str, str] | None = None, columns: int = COLUMNS
    ) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, columns, 0, 0))
        environ = {**os.environ, "COLUMNS": str(columns), "LINES": str(LINES), "TERM": "xterm"}
        environ.pop("NO_COLOR", None)
        environ.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainsentry", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environ,
            close_fds=True,
        )
        os.close(slave)
        self._master = master
        self.output = ""

    def _read(self, timeout: float) -> bool:
        """Read what is there within `timeout`; False once the child closed the terminal."""
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self._master, 65536)
        except OSError:  # EIO: every writer of the pty has exited
            return False
        self.output += data.decode("utf-8", "replace")
        return bool(data)

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in plain(self.output):
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self._read(min(remaining, 1.0)), (
                f"{text!r} not shown; the screen so far:\n{plain(self.output)}"
            )
        return self.output

    def wait(self, timeout: float = 60.0) -> int:
        """Read to the end, then the exit status."""
        deadline = time.monotonic() + timeout
        while self._read(max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"still running; the screen:\n{plain(self.output)}")
        os.close(self._master)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()


def terminal_env(monkeypatch: pytest.MonkeyPatch, columns: int = COLUMNS) -> None:
    """The environment of a colour terminal of a known width, whatever runs the tests."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", str(columns))


class TtyBuffer(io.StringIO):
    """A buffer that says it is a terminal: for the renderers, without a subprocess."""

    def isatty(self) -> bool:
        return True
