"""Telling the supervisor how the daemon is doing: sd_notify, watchdog, and a stuck-loop guard.

The protocol is a few datagrams on the AF_UNIX socket named in
`$NOTIFY_SOCKET` (a leading `@` means Linux's abstract namespace), so it is
written here instead of pulling in a dependency. Without the variable every
call is a no-op: the same daemon runs under systemd, in a container or in a
terminal.

Liveness has one source, the main loop's `Heartbeat`, beaten once per cycle.
systemd's `WatchdogSec=` keep-alives are sent *from that beat*, never from a
timer thread: a thread would keep pinging while the loop is stuck, and the
watchdog would never fire. `/healthz` and `StuckLoopGuard` read the same
heartbeat. The guard exists for supervisors without a watchdog (Docker,
Kubernetes without a liveness probe, a plain `Restart=on-failure` unit): when
the loop has not beaten for too long it ends the process with `os._exit`
— a clean exit would wait for the very thread that is stuck — so the
supervisor restarts it, and the restart resumes from the saved read offsets.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# EX_SOFTWARE: an internal error; Restart=on-failure and Docker's restart policies restart it.
STUCK_EXIT_STATUS = 70


def _address(path: str) -> str:
    """Abstract-namespace sockets are written `@name` in the variable and `\\0name` on the wire."""
    return "\0" + path[1:] if path.startswith("@") else path


class SystemdNotifier:
    """sd_notify(3) for one process; every method is a no-op outside systemd.

    The watchdog is ours only when `$WATCHDOG_USEC` is set and `$WATCHDOG_PID`
    is absent or names this process (a child started by the daemon inherits the
    environment but must not ping on its behalf).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.socket_path = env.get("NOTIFY_SOCKET") or None
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            # systemd's advice: ping at half the timeout, so one late cycle is not a kill.
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_ping = -float("inf")
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def notify(self, *fields: str) -> bool:
        """Send `KEY=value` lines in one datagram; False (and a debug log) when not delivered."""
        if self.socket_path is None:
            return False
        message = "\n".join(fields).encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(_address(self.socket_path))
                sock.sendall(message)
        except OSError as exc:
            # systemd restarted or the socket vanished: never a reason to stop watching runs.
            log.debug("sd_notify to %s failed: %s", self.socket_path, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Type=notify: systemd holds dependants and `systemctl start` until this is sent."""
        fields = ["READY=1", f"MAINPID={os.getpid()}"]
        if status:
            fields.append(f"STATUS={_one_line(status)}")
        return self.notify(*fields)

    def status(self, text: str) -> bool:
        """A line shown by `systemctl status`, e.g. "watching 412 runs, 2 alerts firing"."""
        return self.notify(f"STATUS={_one_line(text)}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        """Sent on SIGHUP before reloading; `ready()` again when done (Type=notify-reload)."""
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more start-up time while a large backfill is read (TimeoutStartSec=)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def watchdog_ping(self, now: float | None = None) -> bool:
        """WATCHDOG=1 if half the watchdog timeout has passed since the last one."""
        if self.watchdog_interval is None:
            return False
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last_ping < self.watchdog_interval:
                return False
            self._last_ping = now
        return self.notify("WATCHDOG=1")


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Heartbeat:
    """When the main loop last completed a cycle: the one measure of "alive".

    `beat()` is called by the loop itself (Daemon's `on_cycle`) and by long
    stretches of work inside a cycle (a backfill reading millions of points),
    so "no beat" means "stuck", not "busy". Readers on other threads only read
    one float, which CPython assigns atomically.
    """

    def __init__(
        self,
        notifier: SystemdNotifier | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._notifier = notifier
        self._clock = clock
        self.last = clock()
        self.beats = 0

    def beat(self) -> None:
        now = self._clock()
        self.last = now
        self.beats += 1
        if self._notifier is not None:
            self._notifier.watchdog_ping(now)

    def age(self) -> float:
        """Seconds since the last beat (or since creation, before the first one)."""
        return max(0.0, self._clock() - self.last)


def health_limit(cycle_interval: float, factor: float = 3.0, floor: float = 10.0) -> float:
    """How old a heartbeat may be before the loop counts as stuck.

    An idle loop beats once per `cycle_interval` (the sweep or poll period), so
    the limit must be a few intervals — never less than `floor` seconds, which
    absorbs a slow cycle on a busy node.
    """
    return max(floor, factor * cycle_interval)


class StuckLoopGuard:
    """A thread that ends the process when the heartbeat is older than `limit` seconds.

    `on_stuck` defaults to printing one line to stderr and `os._exit(70)`:
    nothing else is reliable when the main thread may hold a lock forever.
    Tests pass their own `on_stuck` (or run the default in a child process).
    """

    def __init__(
        self,
        heartbeat: Heartbeat,
        limit: float,
        *,
        check_every: float | None = None,
        on_stuck: Callable[[str], object] | None = None,
    ) -> None:
        if limit <= 0:
            raise ValueError(f"the stuck-loop limit must be positive, got {limit}")
        self.heartbeat = heartbeat
        self.limit = limit
        self.check_every = check_every if check_every is not None else min(5.0, limit / 4)
        self._on_stuck = on_stuck or _exit_stuck
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="stuck-loop-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def check(self) -> bool:
        """One look at the heartbeat; calls `on_stuck` and returns True when it is too old."""
        age = self.heartbeat.age()
        if age <= self.limit:
            return False
        self._on_stuck(
            f"trainsentry: the main loop has not completed a cycle for {age:.0f}s "
            f"(limit {self.limit:.0f}s); exiting so the supervisor restarts it"
        )
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.check_every):
            if self.check():
                return


def _exit_stuck(message: str) -> None:
    # os.write, not logging or sys.stderr: the stuck thread may hold their locks.
    try:
        os.write(2, (message + "\n").encode("utf-8", "replace"))
    finally:
        os._exit(STUCK_EXIT_STATUS)
