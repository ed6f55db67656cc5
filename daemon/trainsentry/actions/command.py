"""A command run when a rule fires: page a human, scancel a job, snapshot a node.

An argument list, never a shell: alert text comes from log files other
people write, and must not become shell syntax. The alert travels in
environment variables (TRAINSENTRY_RUN, _RULE, _SEVERITY, _STEP, _METRIC,
_VALUE, _MESSAGE, _RUN_DIR, and the whole alert as JSON in TRAINSENTRY_ALERT).

The command gets those and a minimal environment (PASSED: the search path, the
user, the locale, the time zone, the temporary directory), never the
daemon's own: that holds the notification URLs read through `env:`, the
HTTP API's token and whatever else its unit or container was given.

It runs in the outbox's action worker, not the main loop, with a timeout; a
failure (non-zero exit, timeout, missing program) is logged and recorded, not
retried and never fatal: a command is not idempotent the way a message is.
"""

from __future__ import annotations

import json
import os
import subprocess

from trainsentry.alert import Transition
from trainsentry.sinks.base import Message, SendResult

OUTPUT_KEPT = 300


def alert_environment(alert: Transition, run_dir: str | None) -> dict[str, str]:
    env = {
        f"TRAINSENTRY_{k.upper()}": str(getattr(alert, k))
        for k in ("run", "rule", "severity", "state", "step", "metric", "value", "message")
    }
    env["TRAINSENTRY_ALERT"] = json.dumps(alert.as_dict(), ensure_ascii=False)
    env["TRAINSENTRY_RUN_DIR"] = run_dir or ""
    return env


PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def command_environment(alert: Transition, run_dir: str | None) -> dict[str, str]:
    """What a command action's process sees: a minimal environment and the alert."""
    env = {k: v for k, v in os.environ.items() if k in PASSED or k.startswith("LC_")}
    env.update(alert_environment(alert, run_dir))
    return env


def run_command(
    argv: list[str], alert: Transition, timeout: float, run_dir: str | None = None
) -> SendResult:
    env = command_environment(alert, run_dir)
    try:
        done = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return SendResult.fatal(f"{argv[0]}: timed out after {timeout:g}s")
    except OSError as exc:
        return SendResult.fatal(f"{argv[0]}: {exc.strerror or exc}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-OUTPUT_KEPT:]
        return SendResult.fatal(f"{argv[0]}: exit status {done.returncode}: {tail}".rstrip(": "))
    return SendResult.success()


class CommandSink:
    """The outbox receiver for command actions: one alert per message, its command in the row."""

    name = "command action"
    takes_attachments = False

    def send(self, message: Message) -> SendResult:
        for notice in message.alerts:
            command = notice.command
            if command is None:  # not an action's notice: nothing to run
                continue
            result = run_command(list(command.argv), notice.alert, command.timeout, notice.run_dir)
            if not result.ok:
                return result
        return SendResult.success()
