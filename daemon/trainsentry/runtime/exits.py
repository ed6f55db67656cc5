"""What the kernel can say of how a process ended, when it is not the daemon's child.

Once its parent has reaped it, a process's exit status is gone from /proc. Two
other witnesses remain on Linux, each behind a capability:
- the process events connector (linux/cn_proc.h): every exit's status as it
  happens, to a netlink socket of a process with CAP_NET_ADMIN (`ExitStatuses`);
- the kernel log: the OOM killer's line naming the pid it killed, in /dev/kmsg
  (CAP_SYSLOG, or kernel.dmesg_restrict=0) or through `journalctl -k` (the
  systemd-journal group) (`KernelLog`).
Both speak in the pids of the first pid namespace. writers.py asks them about
the processes it watches.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from contextlib import suppress

log = logging.getLogger(__name__)

try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not a POSIX system: nothing is asked
    CLK_TCK = 100

# --- the kernel's process events (linux/cn_proc.h, linux/connector.h) ---

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33
RCVBUF = 8 << 20  # ~10k events (an event costs ~770 bytes of buffer) between two drains
# nlmsghdr (16 bytes) + cn_msg (20) + proc_event: what, cpu, timestamp_ns, then for an
# exit: pid, tgid, exit_code (wait(2)'s status), exit_signal
_WHAT = struct.Struct("=I")
_EXIT = struct.Struct("=QIII")
_WHAT_AT, _EXIT_AT, _EXIT_END = 36, 44, 64


def _control(op: bytes) -> bytes:
    """A connector message to the process events' multicast control."""
    cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
    return struct.pack("=IHHII", 16 + len(cn), NLMSG_DONE, 0, 0, 0) + cn


class ExitStatuses:
    """Each process's exit status as the kernel reports it (the proc connector).

    Needs CAP_NET_ADMIN in the first user namespace; listened to only while a writer is
    watched (every exit on the host is an event, ~2 µs each to read and drop). Kernels
    since 6.6 send this socket exit events only; older ones send every process event.
    Drained every cycle: a buffer that overflowed lost events, and the statuses of those
    exits are not known (`lost`).
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self.refused = ""  # why it cannot be listened to, once tried
        self.lost = 0
        self._got: dict[int, int] = {}  # pid → its first exit status seen while wanted

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def listen(self) -> bool:
        if self._sock is not None or self.refused:
            return self._sock is not None
        try:
            sock = socket.socket(
                socket.AF_NETLINK,
                socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        except (OSError, AttributeError) as exc:
            self.refused = f"no netlink connector ({exc})"
            return False
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, CN_IDX_PROC))
            sock.send(_control(struct.pack("=I", PROC_CN_MCAST_LISTEN)))
            # 6.6+: exits only (an older kernel ignores a control of this length)
            sock.send(_control(struct.pack("=II", PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT)))
        except OSError as exc:
            sock.close()
            self.refused = f"{os.strerror(exc.errno) if exc.errno else exc}"
            return False
        self._sock = sock
        return True

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._got.clear()
        if sock is None:
            return
        with suppress(OSError):  # the kernel makes events while anyone listens
            sock.send(_control(struct.pack("=I", PROC_CN_MCAST_IGNORE)))
        sock.close()

    def drain(self, wanted: Collection[int]) -> None:
        """Read the events waiting; keep the exit statuses of the `wanted` pids."""
        sock = self._sock
        if sock is None:
            return
        got = self._got
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # overflowed: the events in it are lost
                    self.lost += 1
                    continue
                log.warning("process events: %s; exit statuses no longer known", exc)
                self.close()
                self.refused = str(exc)
                return
            if len(data) < _EXIT_END or _WHAT.unpack_from(data, _WHAT_AT)[0] != PROC_EVENT_EXIT:
                continue
            _, pid, tgid, status = _EXIT.unpack_from(data, _EXIT_AT)
            if pid == tgid and pid in wanted and pid not in got:  # a process, not a thread
                got[pid] = status

    def status(self, pid: int) -> int | None:
        """The exit status of `pid` seen since it was wanted (taken once)."""
        return self._got.pop(pid, None)

    def keep_only(self, pids: Collection[int]) -> None:
        self._got = {p: s for p, s in self._got.items() if p in pids}


# --- the kernel log ---

_OOM = re.compile(rb"Killed process (\d+) \(|oom-kill:.*?\bpid=(\d+)")
_MONOTONIC_LINE = re.compile(rb"^\[\s*(\d+\.\d+)\]")
KMSG_BUDGET_SECONDS = 0.25  # of one read of /dev/kmsg; the rest is read the next time
JOURNAL_SECONDS = 3.0
OOM_KEPT = 1000


def oom_kills(records: Iterable[tuple[float, bytes]]) -> Iterable[tuple[int, float]]:
    """(pid, when) of each OOM killer's line among (seconds since boot, text) records:
    `Out of memory: Killed process 1234 (python)`, `oom-kill:...,task=python,pid=1234,...`."""
    for at, text in records:
        for match in _OOM.finditer(text):
            yield int(match.group(1) or match.group(2)), at


class KernelLog:
    """The OOM killer's lines, by pid: /dev/kmsg read on from where it was left (the ring
    whole the first time), else `journalctl -k` for the last 15 minutes."""

    def __init__(self, kmsg: str = "/dev/kmsg") -> None:
        self.kmsg = kmsg
        self._fd: int | None = None
        self._tried = False
        self._journal = True  # while journalctl may be run
        self.unreadable = ""  # why neither could be read; "" while one can (or untried)
        self._killed: OrderedDict[int, float] = OrderedDict()  # pid → when (s since boot)

    def oom_killed(self, pid: int, start: int | None) -> bool:
        """Whether the OOM killer killed `pid` since it started (`start`: clock ticks
        since boot; the log's times leave out suspends, so the start is moved back by
        them: a line before it is another process's of the same pid)."""
        self._read()
        at = self._killed.get(pid)
        if at is None:
            return False
        if start is None:
            return True
        try:
            suspended = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
        except (AttributeError, OSError):
            suspended = 0.0
        return at >= start / CLK_TCK - max(0.0, suspended) - 1.0

    def _remember(self, found: Iterable[tuple[int, float]]) -> None:
        for pid, at in found:
            self._killed[pid] = at
            self._killed.move_to_end(pid)
            if len(self._killed) > OOM_KEPT:
                self._killed.popitem(last=False)

    def catch_up(self) -> None:
        """Read /dev/kmsg's new records now (the whole ring the first time), so that the
        read when a process is gone is short; the journal is asked only then."""
        self._open()
        if self._fd is not None:
            self._remember(oom_kills(self._kmsg_records()))

    def _open(self) -> None:
        if self._fd is None and not self._tried:
            self._tried = True
            try:
                self._fd = os.open(self.kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self.unreadable = f"{self.kmsg}: {exc.strerror}"

    def _read(self) -> None:
        self._open()
        if self._fd is not None:
            self._remember(oom_kills(self._kmsg_records()))
        elif self._journal:
            self._remember(oom_kills(self._journal_records()))

    def _kmsg_records(self) -> Iterable[tuple[float, bytes]]:
        """/dev/kmsg's records from where the last read stopped: `prio,seq,usec,flags;text`."""
        assert self._fd is not None
        deadline = time.monotonic() + KMSG_BUDGET_SECONDS
        while time.monotonic() < deadline:
            try:
                record = os.read(self._fd, 16384)
            except BlockingIOError:
                return
            except BrokenPipeError:  # records overwritten before they were read: go on
                continue
            except OSError as exc:
                self.unreadable = f"{self.kmsg}: {exc.strerror}"
                os.close(self._fd)
                self._fd = None
                return
            head, _, text = record.partition(b";")
            fields = head.split(b",")
            try:
                at = int(fields[2]) / 1e6
            except (IndexError, ValueError):
                continue
            yield at, text

    def _journal_records(self) -> list[tuple[float, bytes]]:
        """The kernel's lines of the last 15 minutes in the journal, where it lets this
        user see them (the systemd-journal group); said why not, and not asked again."""
        kmsg = self.unreadable
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            self.unreadable, self._journal = f"{kmsg}; no journalctl", False
            return []
        command = [journalctl, "-k", "--no-pager", "-o", "short-monotonic"]
        try:
            done = subprocess.run(
                [*command, "--since=-15min"],
                capture_output=True,
                timeout=JOURNAL_SECONDS,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.unreadable = f"{kmsg}; journalctl -k: {exc}"
            return []
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        blind = [x for x in said if "not seeing" in x or "No journal files" in x]
        if done.returncode != 0 or blind:
            why = (blind or said or [f"exit status {done.returncode}"])[0]
            self.unreadable, self._journal = f"{kmsg}; journalctl -k: {why}", False
            return []
        self.unreadable = ""
        out = []
        for line in done.stdout.splitlines():
            match = _MONOTONIC_LINE.match(line)
            if match is not None:
                out.append((float(match.group(1)), line))
        return out
