"""Without the probe: the process that writes a run's files, and how it ended.

A plain `python train.py > stdout.log` that writes `metrics.jsonl` leaves no
meta record naming its process. On Linux the kernel says who holds a file
open, as `fuser` finds them: each /proc/<pid>/fd/<n> is a link to what the
descriptor holds, and /proc/<pid>/fdinfo/<n> says how it was opened (`flags:`,
octal; O_WRONLY or O_RDWR is a writer). The process found is watched as the
probe's is (processes.py: a look every 2 s, a second look after the run's
files were read once more) and its run's life ends with a line of its own.

Which process. Every process holding the file for writing is a writer: the
job, its DataLoader workers (forked with its descriptors), a shell that ran it
(`bash run.sh > log`), torchrun's agent for its ranks' stdout files. The
oldest is watched: the one the others came from, which lives as long as the
job (a worker exits with each epoch). A log written through a pipe (`python
train.py | tee log`) is held by tee, whose end says nothing of the job's (it
exits 0 when the job is killed): for a pipe tool (PIPE_TOOLS) the process
writing into its stdin is watched instead. A process in another mount
namespace (a container) names the file by another path, and one that opens
its log for each line and closes it is found only by chance: those runs are
not watched this way.

When to look. A scan reads every process's fd links (SCAN_COST below), so it
is done when a run's data first comes and again, for the runs with no writer
found that still grow, all together at most every RESCAN_SECONDS; every run
due goes in one pass, and a pass is made at most once a look
(processes.CHECK_SECONDS). A run that ended with its writer and grows again is
looked for at once: the process found writing it is a restart (`stage 1 &&
stage 2` appending to one log), its rows read before that look not judged, as
a run's last words are. Processes that cannot be read (another user's, without
CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE) are skipped.

How it ended. The exit status of a process that is not the daemon's child is
gone from /proc once its parent has reaped it. What can still tell:
- the kernel's process events (exits.py, CAP_NET_ADMIN): each exit's status as
  it happens, listened to only while a writer is watched;
- a zombie (exited, not yet reaped): its status is still in /proc (processes.py);
- the kernel log (exits.py: /dev/kmsg, else `journalctl -k`): the OOM killer's
  line for that pid;
- its file: a JSONL or CSV log whose last line is cut off was left by a writer
  that never finished the line (a clean exit flushes its buffers): killed.
The kernel's pids are those of the first pid namespace: the connector and the
kernel log are asked only by a daemon in it.

The verdict (`judge`), a false page weighed against a missed crash:
- exit status 0: finished; no page, and its silence is no "went quiet" either;
- SIGTERM, SIGINT, SIGHUP: asked to stop, cancelled (`process_stopped`, warning);
- any other signal, a non-zero status, the OOM killer's line, a cut last line:
  crashed (`process_exited`, critical);
- nothing known and its files written within RECENT_SECONDS: exited, its status
  unknown (`process_gone`, warning). From outside the process a clean end and a
  `kill -9` of a job that flushes each line look alike, and most such ends are
  clean: a page for each would teach people to ignore it. A warning within
  seconds is what that doubt is worth; it takes the place of the warning
  `run_stalled` gave such a run 15 minutes later, and where the connector is
  readable there is no doubt;
- nothing known, its files untouched for longer: it stopped writing long before
  it went (the daemon was down, the job closed its log and did other things):
  nothing is said and the run goes on as its logs tell (the no-data rules).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainsentry.rules.run_life import WRITER, Ending, RunProcess
from trainsentry.runtime.exits import ExitStatuses, KernelLog
from trainsentry.runtime.processes import started_at

log = logging.getLogger(__name__)

# the logs of each run, followed on this host: (path, kind) (runtime/loop.Daemon.own_logs)
LogsOf = Callable[[Collection[str]], Mapping[str, list[tuple[Path, str]]]]

# SCAN_COST: a pass over /proc lists each process's fd directory and reads each link,
# about 5 µs a descriptor: 13 ms for 385 processes holding 2,900 descriptors, 28 ms for
# 690 holding 5,100, on a shared 2-core VM (bench/writer_scan.py). A GPU node of 8 ranks
# with 8 DataLoader workers each, ~200 descriptors a process, is ~15k descriptors, ~75 ms
# a pass; hence a pass only for a new run, and for runs still unwatched and growing at
# most once every RESCAN_SECONDS, all of them together.
RESCAN_SECONDS = 30.0  # a run with no writer found, still growing, is looked for again
RECENT_SECONDS = 60.0  # a writer gone whose files are older than this is not judged
PIPE_TOOLS = frozenset(
    {"tee", "ts", "cat", "sed", "awk", "gawk", "mawk", "grep", "rotatelogs", "cronolog"}
)
TORN_KINDS = frozenset({"jsonl", "csv"})  # logs whose writer ends every record with "\n"
# the logs a job's own process writes; a tracker's are written by its service (wandb-core
# writes a W&B run's records and output.log), whose end is not the job's, and it says
# how its runs ended itself (sources/wandb_records.py, mlflow_files.py)
WATCHED_KINDS = frozenset({"tfevents", "jsonl", "csv", "text"})
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
COMMAND_CHARS = 60
INIT_PID_NS = "pid:[4026531836]"  # the first pid namespace (PROC_PID_INIT_INO)
O_ACCMODE, O_RDONLY = 0o3, 0o0


@dataclass(frozen=True, slots=True)
class Writer:
    """A process holding a file open for writing."""

    pid: int
    start: int  # clock ticks since boot (field 22 of /proc/<pid>/stat)
    command: str


def _writable(proc_pid: str, fd: str) -> bool:
    """Whether descriptor `fd` of the process at `proc_pid` was opened for writing."""
    try:
        with open(f"{proc_pid}/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & O_ACCMODE != O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return False


def _holders(targets: Collection[str], proc: str = "/proc") -> dict[str, set[int]]:
    """For each of `targets` (what an fd link reads: a path, "pipe:[123]"), the pids that
    hold it open for writing. Processes that cannot be read are skipped."""
    out: dict[str, set[int]] = {}
    me = str(os.getpid())
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or name == me:
            continue
        try:  # links read relative to the directory: no path walk per descriptor
            fd_dir = os.open(f"{proc}/{name}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # gone, or another user's (CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE)
            continue
        try:
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(fd, dir_fd=fd_dir)
                except OSError:
                    continue
                if target in targets and _writable(f"{proc}/{name}", fd):
                    out.setdefault(target, set()).add(int(name))
        except OSError:
            pass
        finally:
            os.close(fd_dir)
    return out


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(4096)
    except OSError:
        return b""


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f()]+")


def command_of(pid: int, proc: str = "/proc") -> str:
    """The process's command line, shortened to show in a line of the run's life: each
    absolute path by its base name (`python train.py --config exp1.yaml`), at most
    COMMAND_CHARS, no parentheses or control characters."""
    argv = [a for a in _read(f"{proc}/{pid}/cmdline").split(b"\0") if a]
    if argv:
        words = [os.path.basename(a) if a.startswith(b"/") else a for a in argv]
        words[0] = os.path.basename(words[0])
        text = " ".join(w.decode("utf-8", "replace") for w in words)
    else:
        text = _read(f"{proc}/{pid}/comm").decode("utf-8", "replace")
    text = " ".join(_UNSAFE.sub(" ", text).split()) or "?"
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def _oldest(pids: Iterable[int], proc: str) -> Writer | None:
    """The oldest live process of `pids`: the one the others came from."""
    live = [(start, pid) for pid in pids if (start := started_at(pid)) is not None]
    if not live:
        return None
    start, pid = min(live)
    return Writer(pid, start, command_of(pid, proc))


def _fed_by_pipe(pid: int, proc: str) -> str | None:
    """The pipe a pipe tool (tee) copies from its stdin; None for any other process."""
    if _read(f"{proc}/{pid}/comm").strip().decode("utf-8", "replace") not in PIPE_TOOLS:
        return None
    try:
        stdin = os.readlink(f"{proc}/{pid}/fd/0")
    except OSError:
        return None
    return stdin if stdin.startswith("pipe:") else None


def scan(files: Mapping[str, str], proc: str = "/proc") -> dict[str, Writer]:
    """For each file (key: its path as followed; value: its path as fd links name it,
    resolved), the oldest process that holds it open for writing or, for a pipe tool's
    file, the oldest writing into that tool's stdin. A file no process holds is left out."""
    key_of = {real: key for key, real in files.items()}
    out: dict[str, Writer] = {}
    piped: dict[str, tuple[Writer, str]] = {}
    for target, pids in _holders(key_of.keys(), proc).items():
        writer = _oldest(pids, proc)
        if writer is None:
            continue
        out[key_of[target]] = writer
        pipe = _fed_by_pipe(writer.pid, proc)
        if pipe is not None:
            piped[key_of[target]] = (writer, pipe)
    if piped:  # a second pass, rare: the job behind `| tee log`
        feeders = _holders({pipe for _, pipe in piped.values()}, proc)
        for key, (tool, pipe) in piped.items():
            job = _oldest(feeders.get(pipe, set()) - {tool.pid}, proc)
            if job is not None:
                out[key] = job
    return out


# --- the verdict ---


def judge(
    process: RunProcess, status: int | None, *, oom: bool, torn: bool, recent: bool
) -> Ending:
    """How a writer gone ended, from what could be known (see the module)."""
    line = process.writer_line
    if oom:
        return Ending("crashed", line("was killed by the OOM killer"))
    if status is not None:
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = f"signal {number}"
            if number in STOP_SIGNALS:
                return Ending("cancelled", line(f"was stopped by {name}"))
            core = " (core dumped)" if os.WCOREDUMP(status) else ""
            return Ending("crashed", line(f"was killed by {name}{core}"))
        code = os.WEXITSTATUS(status)
        if code == 0:
            return Ending("finished")
        return Ending("crashed", line(f"exited with status {code}"))
    if torn:
        return Ending("crashed", line("is gone, its last line cut off"))
    if recent:
        return Ending("exited", line("is gone, its exit status unknown"))
    return Ending("")


def _torn(path: str) -> bool:
    """Whether the file ends inside a line: its writer never finished the line."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size:
                return False
            f.seek(size - 1)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _written_within(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime <= seconds
    except OSError:
        return False


class WriterWatch:
    """The runs whose writers to look for and when, the writers found, and how one that
    is gone ended (see the module)."""

    def __init__(self, host: str, namespace: str, proc: str = "/proc") -> None:
        self.host, self.namespace, self.proc = host, namespace, proc
        self.exits = ExitStatuses()
        self.kernel = KernelLog()
        # the connector's and the kernel log's pids are those of the first pid namespace
        self.kernel_pids = namespace == INIT_PID_NS
        self._grew: set[str] = set()  # runs with data since their last scan
        self._scanned: set[str] = set()  # runs looked for once (and not new again since)
        self._next_rescan = 0.0  # when the runs looked for before may be looked for again
        # writer → its run's files it holds, with their kinds
        self._held: dict[tuple[int, int | None], list[tuple[str, str]]] = {}
        self.scans = 0
        self.scan_seconds = 0.0
        self._said: set[str] = set()

    def grew(self, run: str) -> None:
        self._grew.add(run)

    def forget(self, run: str) -> None:
        self._grew.discard(run)
        self._scanned.discard(run)

    def gone(self, run: str) -> None:
        """The run's writer is gone: a process writing it next is looked for at once."""
        self._scanned.discard(run)

    def due(self, now: float, unwatched: Callable[[list[str]], list[str]]) -> list[str]:
        """The runs to look for now, watched by no process (`unwatched`) and grown since
        they were last looked for: those never looked for, at once; the others together,
        at most every RESCAN_SECONDS (so runs whose writers cannot be seen cost one pass
        over /proc every RESCAN_SECONDS, however many they are)."""
        if not self._grew:
            return []
        if now >= self._next_rescan:
            ready = list(self._grew)
            self._next_rescan = now + RESCAN_SECONDS
        else:
            ready = [r for r in self._grew if r not in self._scanned]
        if not ready:
            return []
        self._grew.difference_update(ready)
        self._scanned.update(ready)
        return unwatched(ready)

    def find(self, runs: Collection[str], logs_of: LogsOf) -> list[tuple[str, RunProcess]]:
        """Each run's writer: of the processes holding its own files open for writing, the
        oldest. One pass over /proc for all of them. A run with a tracker's files is left
        out (WATCHED_KINDS), and so is a run whose only files are another's (the ranks of
        one `slurm-7.out`: the file's own run is watched, not each of its ranks)."""
        files: dict[str, str] = {}
        run_of: dict[str, str] = {}
        kinds: dict[str, str] = {}
        for run, logs in logs_of(set(runs)).items():
            if any(kind not in WATCHED_KINDS for _, kind in logs):
                continue
            for path, kind in logs:
                key = str(path)
                files[key], run_of[key], kinds[key] = os.path.realpath(key), run, kind
        if not files:
            return []
        began = time.perf_counter()
        found = scan(files, self.proc)
        self.scans += 1
        self.scan_seconds += time.perf_counter() - began
        chosen: dict[str, tuple[Writer, list[str]]] = {}
        for key in sorted(found):
            writer, run = found[key], run_of[key]
            had = chosen.get(run)
            if had is None or (writer.start, writer.pid) < (had[0].start, had[0].pid):
                chosen[run] = (writer, [key])
            elif had[0] == writer:
                had[1].append(key)
        out = []
        for run, (w, keys) in chosen.items():
            process = RunProcess(
                self.host, w.pid, w.start, self.namespace, keys[0], 0, by=WRITER, command=w.command
            )
            self._held[(w.pid, w.start)] = [(k, kinds[k]) for k in keys]
            out.append((run, process))
            log.info("watching process %d (%s) writing %s (run %s)", w.pid, w.command, keys[0], run)
        return out

    def watching(self, pids: Collection[int]) -> None:
        """The writers watched now: exit statuses are listened to while there are any."""
        self.exits.keep_only(pids)
        self._held = {k: v for k, v in self._held.items() if k[0] in pids}
        if not pids:
            self.exits.close()
            return
        if self.kernel_pids:
            self.kernel.catch_up()
        if self.kernel_pids and not self.exits.listening and self.exits.listen():
            self._say(logging.INFO, "exit statuses of jobs' processes: from the kernel")
        elif not self.exits.listening:
            why = self.exits.refused or "not in the first pid namespace"
            self._say(
                logging.WARNING,
                f"exit statuses of jobs' processes without the probe are unknown ({why}; "
                "the kernel's process events need CAP_NET_ADMIN): one gone is told as "
                "exited, a warning, unless the kernel log or its file says more",
            )

    def drain(self, pids: Collection[int]) -> None:
        self.exits.drain(pids)

    def ending(self, process: RunProcess, zombie: int | None) -> Ending:
        """How the writer `process`, found gone, ended (`zombie`: its status where a look
        saw it exited and not yet reaped). After a daemon restart the kinds of its files
        are not known: no cut line is looked for then."""
        status = zombie if zombie is not None else self.exits.status(process.pid)
        oom = self.kernel_pids and self.kernel.oom_killed(process.pid, process.pid_start)
        if self.kernel.unreadable and self.kernel_pids:
            self._say(
                logging.WARNING,
                f"the kernel log is unreadable ({self.kernel.unreadable}): the OOM killer's "
                "lines are not looked for (CAP_SYSLOG or kernel.dmesg_restrict=0 for "
                "/dev/kmsg; the systemd-journal group for journalctl -k)",
            )
        logs = self._held.pop((process.pid, process.pid_start), [(process.path, "")])
        torn = status is None and any(_torn(p) for p, kind in logs if kind in TORN_KINDS)
        recent = any(_written_within(p, RECENT_SECONDS) for p, _ in logs)
        return judge(process, status, oom=oom, torn=torn, recent=recent)

    def _say(self, level: int, line: str) -> None:
        """A line of the daemon's log, once."""
        if line not in self._said:
            self._said.add(line)
            log.log(level, "%s", line)
