"""sd_notify against a real datagram socket standing in for systemd; the stuck-loop guard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clock import Clock
from support.paths import REPO

from trainsentry.runtime.systemd import (
    STUCK_EXIT_STATUS,
    Heartbeat,
    StuckLoopGuard,
    SystemdNotifier,
    health_limit,
)
from trainsentry.state.damage import UNUSABLE_EXIT_STATUS
from trainsentry.state.dir_lock import IN_USE_EXIT_STATUS


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET: every datagram, as text."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def received(self) -> list[str]:
        # sd_notify's sendall returns once the datagram is queued here: nothing to wait for.
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[FakeSystemd, str]]:
    path = str(tmp_path / "notify.sock")
    fake = FakeSystemd(path)
    yield fake, path
    fake.sock.close()


def test_outside_systemd_everything_is_a_no_op() -> None:
    notifier = SystemdNotifier(environ={})
    assert not notifier.enabled
    assert not notifier.ready("hi") and not notifier.status("x") and not notifier.stopping()
    assert notifier.watchdog_interval is None and not notifier.watchdog_ping()


def test_ready_status_and_stopping_reach_the_socket(systemd: tuple[FakeSystemd, str]) -> None:
    fake, path = systemd
    notifier = SystemdNotifier(environ={"NOTIFY_SOCKET": path})
    assert notifier.ready("watching 3 runs\n(2 firing)")
    assert notifier.status("reading backlog: 40%")
    assert notifier.extend_timeout(90)
    assert notifier.reloading()
    assert notifier.stopping()
    ready, status, extend, reloading, stopping = fake.received()
    assert ready == f"READY=1\nMAINPID={os.getpid()}\nSTATUS=watching 3 runs (2 firing)"
    assert status == "STATUS=reading backlog: 40%"
    assert extend == "EXTEND_TIMEOUT_USEC=90000000"
    assert reloading.startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert stopping == "STOPPING=1"


def test_an_abstract_namespace_socket_is_reached_through_its_at_sign() -> None:
    name = f"trainsentry-test-{os.getpid()}-{threading.get_ident()}"
    fake = FakeSystemd("\0" + name)
    try:
        assert SystemdNotifier(environ={"NOTIFY_SOCKET": "@" + name}).ready()
        assert fake.received()[0].startswith("READY=1")
    finally:
        fake.sock.close()


def test_a_vanished_socket_is_not_an_error(tmp_path: Path) -> None:
    notifier = SystemdNotifier(environ={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier.enabled and not notifier.ready()


def test_keep_alives_come_from_the_heartbeat_at_half_the_watchdog_timeout(
    systemd: tuple[FakeSystemd, str],
) -> None:
    fake, path = systemd
    notifier = SystemdNotifier(environ={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "5000000"})
    assert notifier.watchdog_interval == 2.5
    clock = Clock(1000.0)
    heartbeat = Heartbeat(notifier, clock=clock)
    assert fake.received() == []  # no beat, no keep-alive: nothing pings on its own
    heartbeat.beat()
    clock.now += 1.0
    heartbeat.beat()  # too soon after the last keep-alive
    clock.now += 1.6
    heartbeat.beat()
    assert fake.received() == ["WATCHDOG=1", "WATCHDOG=1"]
    clock.now += 100
    assert fake.received() == []  # a stuck loop sends nothing, so systemd's watchdog fires
    assert heartbeat.age() == pytest.approx(100) and heartbeat.beats == 3


def test_the_watchdog_of_another_process_is_not_ours(systemd: tuple[FakeSystemd, str]) -> None:
    _, path = systemd
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}
    assert SystemdNotifier(environ=env).watchdog_interval is None
    env["WATCHDOG_PID"] = str(os.getpid())
    assert SystemdNotifier(environ=env).watchdog_interval == 2.5


def test_the_health_limit_is_a_few_cycles_and_never_tiny() -> None:
    assert health_limit(30.0) == 90.0
    assert health_limit(0.5) == 10.0


def test_the_guard_acts_only_when_the_heartbeat_is_too_old() -> None:
    clock = Clock(1000.0)
    heartbeat = Heartbeat(clock=clock)
    calls: list[str] = []
    guard = StuckLoopGuard(heartbeat, limit=60, on_stuck=calls.append)
    clock.now += 59
    assert not guard.check()
    heartbeat.beat()
    clock.now += 59
    assert not guard.check() and calls == []
    clock.now += 2
    assert guard.check()
    assert calls == [
        "trainsentry: the main loop has not completed a cycle for 61s (limit 60s); "
        "exiting so the supervisor restarts it"
    ]


def test_the_guard_thread_fires_on_a_stuck_loop() -> None:
    clock = Clock(1000.0)
    fired = threading.Event()
    guard = StuckLoopGuard(
        Heartbeat(clock=clock), limit=5, check_every=0.01, on_stuck=lambda _msg: fired.set()
    )
    guard.start()
    try:
        clock.now += 6
        assert fired.wait(10)
    finally:
        guard.stop()


def test_a_stuck_process_exits_by_itself_so_its_supervisor_restarts_it() -> None:
    child = textwrap.dedent(
        """
        import threading
        from trainsentry.runtime.systemd import Heartbeat, StuckLoopGuard
        guard = StuckLoopGuard(Heartbeat(), limit=0.2, check_every=0.02)
        guard.start()
        threading.Event().wait()  # the main loop, stuck for good
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == STUCK_EXIT_STATUS
    assert "the main loop has not completed a cycle" in done.stderr
    assert "exiting so the supervisor restarts it" in done.stderr


def test_the_shipped_unit_restarts_on_a_stuck_loop_but_not_on_what_a_restart_cannot_fix() -> None:
    unit = (REPO / "deploy" / "trainsentry.service").read_text().splitlines()
    prevent = [
        line.split("=", 1)[1].split()
        for line in unit
        if line.startswith("RestartPreventExitStatus=")
    ]
    assert "Restart=on-failure" in unit
    assert [set(map(int, p)) for p in prevent] == [{UNUSABLE_EXIT_STATUS, IN_USE_EXIT_STATUS}]
    assert STUCK_EXIT_STATUS not in {UNUSABLE_EXIT_STATUS, IN_USE_EXIT_STATUS}
