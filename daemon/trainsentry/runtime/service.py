"""`trainsentry run`: the wiring of one long-lived daemon from a validated Config.

Everything here is assembly — the stages (runtime, engine, notifier, HTTP
API, systemd) know nothing of one another; this module connects them and
owns the process-level concerns: signals (stop, SIGHUP reload), heartbeats,
and what is printed at start and stop. The CLI only turns flags into a Config.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trainsentry import __version__
from trainsentry.alert import Transition
from trainsentry.alerts.grouping import FiringBook
from trainsentry.alerts.notifier import Notifier
from trainsentry.alerts.outbox import Outbox
from trainsentry.config import Config, ConfigError, load_config
from trainsentry.http_api import ApiServer, DaemonSnapshot, HttpApiError, LiveView, SnapshotBoard
from trainsentry.http_api.view import RunStatus, runs_of_store
from trainsentry.jobs import member_of
from trainsentry.point import CHECKPOINT_PREFIX, ProbeMark, Row, RunEnd, TextEvent, Trace, points_of
from trainsentry.rules.engine import RUN_WIDE, Engine
from trainsentry.rules.loader import RuleFileError, load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.run_life import WRITER, Ending
from trainsentry.runtime.loop import Daemon
from trainsentry.runtime.processes import CHECK_SECONDS, ProcessCheck
from trainsentry.runtime.restart import AlertMemory
from trainsentry.runtime.silence_clock import SilenceClock
from trainsentry.runtime.systemd import Heartbeat, StuckLoopGuard, SystemdNotifier, health_limit
from trainsentry.runtime.writers import WriterWatch
from trainsentry.sources import names
from trainsentry.sources.checkpoint_files import use_names
from trainsentry.state.damage import StateUnusable, set_aside_if_damaged
from trainsentry.state.dir_lock import DirLock, LockError, StateDirInUse
from trainsentry.state.disk_full import HeldState, WriteTrouble
from trainsentry.stop_signals import on_stop, signals_deferred
from trainsentry.store import Store
from trainsentry.store.limits import SeriesLimit
from trainsentry.store.log_lines import LogLines
from trainsentry.store.ranks import RankBook
from trainsentry.store.traces import RunTraces
from trainsentry.terminal.printer import AlertPrinter
from trainsentry.terminal.progress import BackfillReporter

log = logging.getLogger(__name__)

# The loop turns at least this often, idle or not, so heartbeats (healthz,
# systemd's watchdog) mean "the loop is alive", not "something was written".
HEARTBEAT_SECONDS = 5.0
# Repeat intervals are checked this often, not every cycle (a thousand live runs
# make the loop cycle many times a second), and no-data deadlines this often or,
# when the rules' silences are minutes, every `Engine.tick_every`.
TICK_SECONDS = 1.0
# How long a step read in part waits for the rest of it (Engine.feed_rows): a writer that
# flushes a step in pieces sends the rest with its next flush, at the latest with the
# next step's first values (SummaryWriter's queue of 10 events): a step's time later,
# seconds for a large model. Only a step holding some of the tags the step before it
# held, not all, waits; a NaN in one is paged at most this much later.
OPEN_STEP_SECONDS = 5.0
# The stuck-loop guard is generous: killing a healthy daemon in a long
# backfill would be worse than restarting a hung one a minute late.
STUCK_SECONDS = 300.0


class ServiceError(Exception):
    """A problem at startup the operator must fix (bad rules, state dir, port); `status`
    is the exit status (2, a usage mistake, unless a restart cannot fix it either)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class Service:
    def __init__(
        self,
        config: Config,
        paths: list[Path],
        state_dir: Path,
        *,
        verbose: int = 0,
        alerts_jsonl: Path | None = None,
        reread: Callable[[], Config] | None = None,
    ) -> None:
        """`reread`: the config a SIGHUP loads (default: the file again, as it is)."""
        self.config = config
        use_names(config.checkpoint_names)  # what is a checkpoint, before any root is read
        self._reread = reread or (
            (lambda: load_config(config.source)) if config.source else (lambda: config)
        )
        try:
            self.ruleset = load_rules(list(config.rules))
            self.engine = Engine(self.ruleset)
            self.log_engine = LogEngine(self.ruleset)  # pattern rules on text logs
        except RuleFileError as exc:
            raise ServiceError("\n".join(exc.errors)) from None
        self.lock = self._lock(state_dir)  # one daemon per state dir, for this one's life
        try:
            set_aside_if_damaged(state_dir / "state.db")
        except StateUnusable as exc:
            raise ServiceError(str(exc), exc.status) from None
        try:
            trouble = WriteTrouble(state_dir / "state.db")  # a full disk: alerting goes on
            state = HeldState(state_dir / "state.db", trouble)
            self.outbox = Outbox(state_dir / "state.db", trouble=trouble)
        except Exception as exc:
            raise ServiceError(f"cannot open state dir {state_dir}: {exc}") from None
        self.state_dir = state_dir
        self.store = Store(recent_size=config.retention, judged=lambda tag: self.engine.reads(tag))
        self.log_lines = LogLines()  # the last lines of each run's text logs, for bundles
        self.traces = RunTraces()  # what each run was started with (params, config)
        self.silence = SilenceClock()  # no-data checks immune to wall-clock steps
        self.series_limit = SeriesLimit()  # a run writing a new tag per line is bounded
        # each rank's step, pace, node and last error, for /metrics and status (a fleet's view)
        self.ranks = RankBook(config.node, lambda tag: self.engine.aliases.resolve(tag))
        self.processes = ProcessCheck()  # the jobs on this host that the probe names
        # without the probe: the processes found writing runs' files (writers.py)
        self.writers = WriterWatch(self.processes.host, self.processes.namespace)
        self._writer_pids: set[int] = set()
        since = time.time() - config.history
        self.printer = AlertPrinter(since=since, jsonl_path=alerts_jsonl)
        self.notifier = Notifier(
            list(config.routes),
            self.outbox,
            state_dir=state_dir,
            store=self.store,
            rule_of=lambda name: next((r for r in self.engine.rules if r.name == name), None),
            run_dir=lambda run: self.daemon.run_dir(run),
            run_meta=self._run_meta,
            since=since,
            link_template=config.link_template,
            control_dir=config.control_dir.absolute() if config.control_dir else None,
            # a recovery is told once it has held as long as an incident's updates wait
        )
        sinks = [self._evaluate, self._print_points] if verbose >= 2 else [self._evaluate]
        self.memory = AlertMemory(self, lambda: self.daemon.stats.relearned)
        self.daemon = Daemon(
            paths,
            state,
            sinks,
            poll=config.poll,
            on_release=self._released,
            on_cycle=self._on_cycle,
            owns_run=config.shard.owns,
            max_wait=HEARTBEAT_SECONDS,
            memory=self.memory,
            snapshot_every=config.snapshot_interval,
            on_events=self._text_events,
            on_report=self._reported,
            on_marks=self._probe_marks,
            on_follow=lambda run: self.engine.expect(run),
        )
        self.systemd = SystemdNotifier()
        self.heartbeat = Heartbeat(self.systemd)
        self.daemon.on_progress = self.heartbeat.beat
        self.daemon.on_backfill = BackfillReporter()
        self.board = SnapshotBoard()
        self.board.on_ask = self.daemon.wake  # a reader's wait ends with the next cycle
        self.http: ApiServer | None = None
        self._reload_requested = False
        self._next_tick = self._next_clocks = 0.0

    @staticmethod
    def _lock(state_dir: Path) -> DirLock:
        """The state dir's lock, or the refusal naming the daemon that holds it."""
        try:
            lock = DirLock.take(state_dir)
        except StateDirInUse as exc:
            raise ServiceError(str(exc), exc.status) from None
        except LockError as exc:
            raise ServiceError(
                f"{exc}; give a writable state dir with --state-dir (or state_dir in the config)"
            ) from None
        if lock.unsupported:
            log.warning(
                "cannot lock the state dir %s (%s): nothing keeps a second daemon off it; "
                "run one daemon per state dir",
                state_dir,
                lock.unsupported,
            )
        elif lock.left is not None:
            print(
                f"trainsentry: state dir {state_dir} was left locked by {lock.left.said()}, "
                "which ended without a clean stop; taken over",
                flush=True,
            )
        return lock

    # -- the pipeline ---------------------------------------------------------

    @property
    def book(self) -> FiringBook:
        """What is firing and who was told (the notifier's; saved with the engine)."""
        return self.notifier.book

    @book.setter
    def book(self, book: FiringBook) -> None:
        self.notifier.book = book

    def deliver(self, transitions: list[Transition]) -> None:
        """Show and tell a cycle's transitions (before that cycle's offsets commit)."""
        if not transitions:  # nearly every record: nothing changed
            return
        book = self.notifier.book
        told = frozenset(
            t.key
            for t in transitions
            if t.state == "resolved" and (entry := book.get(t.key)) is not None and entry.shown
        )
        self.printer(transitions, told)
        self.notifier.submit(transitions)
        self.daemon.commit_soon()  # what was shown must not be shown again after a kill

    def _evaluate(self, run: str, rows: list[Row]) -> None:
        rows = self.series_limit.admit(run, rows)
        if not rows:  # every value of the read past the run's series limit: nothing to judge
            return
        if rows[0].tags and rows[0].tags[0].startswith(CHECKPOINT_PREFIX):
            self._checkpoints(run, rows)  # a checkpoint root's read: all its rows are such
            return
        self.store.extend_rows(run, rows)
        self.ranks.rows(run, rows)
        self.writers.grew(run)
        self.deliver(self.log_engine.stepped(run, rows))
        self.deliver(self.log_engine.saw(run, rows[-1].step, rows[-1].wall_time))
        life = self.log_engine.life(run)
        if life is not None and life.ended:
            return  # the last words of a run that ended, not a run to judge (log_rules.py)
        for part, step in self.silence.arrived(run, rows):  # cut where a clock stepped
            if step:  # a step left open is judged on the clock it was read by
                self.deliver(self.engine.feed_rows(run, ()))
                self.engine.shift_clock(run, step)
            self.deliver(self.engine.feed_rows(run, part, now=time.time()))

    def _checkpoints(self, run: str, rows: list[Row]) -> None:
        """A checkpoint root's rows (sources/checkpoints.py): saves on disk, stamped with
        their completion, not records the job logged, so they move no run's step, pace or
        silence; the job's checkpoints are judged against its records (log_rules.py), and
        the rules on their sizes and the disk's room by the engine."""
        self.store.extend_rows(run, rows)
        self.deliver(self.log_engine.stepped(run, rows))
        life = self.log_engine.life(run)
        if life is None or not life.ended:
            self.deliver(self.engine.feed_rows(run, rows))

    def relearned_transitions(self, transitions: list[Transition]) -> None:
        """Transitions re-derived after a restart (restart.py): the firing book learns them."""
        self.notifier.submit(transitions, relearned=True)

    def _print_points(self, run: str, rows: list[Row]) -> None:
        text = "".join(json.dumps(p.as_dict()) + "\n" for p in points_of(run, rows))
        with signals_deferred():
            sys.stdout.write(text)
            sys.stdout.flush()

    def _text_events(self, run: str, events: list[TextEvent]) -> None:
        """A text log's events: kept for bundles, judged by the pattern rules; a run they
        say ended (crashed, preempted) has its metric alerts ended with that reason."""
        self.log_lines.extend(events)
        self.ranks.events(events)
        for grown in {e.run for e in events}:
            self.writers.grew(grown)
        self.deliver(self.log_engine.feed(events))
        self._end_runs()

    def _reported(self, traces: list[tuple[str, Trace]], ends: list[RunEnd]) -> None:
        """What a tracker said of its runs: their traces kept for bundles and /api/runs;
        a run it says ended (MLflow's FAILED, a W&B exit code) has its alerts ended so."""
        for run, trace in traces:
            self.traces.add(run, trace)
        for end in ends:
            self.deliver(self.log_engine.reported(end.run, end.state, end.cause, end.wall))
        self._end_runs()

    def _probe_marks(self, run: str, marks: list[ProbeMark]) -> None:
        """The probe's meta records (the processes to watch) and end records (a run that
        finished, or ended on an exception)."""
        self.ranks.marks(marks)
        self.deliver(self.log_engine.marked(marks))
        self._end_runs()

    def _end_runs(self) -> None:
        """The runs that just ended: their metric alerts end with the reason, and their
        silence is no longer a page (a finished run is not "went quiet")."""
        while self.log_engine.ended:
            ended, life = self.log_engine.ended.pop(0)
            self.deliver(self.engine.finish(ended, life.reason))
            self.silence.forget(ended)

    def _check_processes(self, now: float) -> None:
        """Every few seconds, idle or not: a job's process gone without an end record
        (processes.py), the probe's or, without it, the one found writing the run's files
        (writers.py). A first look asks for the run's files to be read once more; the
        cycle after that read confirms. Runs new or unwatched are looked for at a look."""
        check, writers = self.processes, self.writers
        if self._writer_pids:  # the kernel's exit statuses, read before they are needed
            writers.drain(self._writer_pids)
        if check.suspects:
            watched = self.log_engine.processes(check.host, check.namespace)
            for run, path in check.confirm(watched):
                ending = self._ending(run, path)
                self.deliver(self.log_engine.process_gone(run, path, time.time(), ending))
                if ending is not None:
                    writers.gone(run)
            self._end_runs()
        if now >= check.next_look:
            due = writers.due(now, self.log_engine.unwatched)
            for run, process in writers.find(due, self.daemon.own_logs):
                self.deliver(self.log_engine.writing(run, process))
            watched = self.log_engine.processes(check.host, check.namespace)
            self._writer_pids = {p.pid for _, p in watched if p.by == WRITER}
            writers.watching(self._writer_pids)
            for run in check.look(watched, now):
                self.daemon.look_again(run)
            # an idle loop turns every heartbeat; with processes to look at, every look
            wait = min(HEARTBEAT_SECONDS, CHECK_SECONDS) if watched else HEARTBEAT_SECONDS
            self.daemon.max_wait = wait

    def _ending(self, run: str, path: str) -> Ending | None:
        """How a writer found gone ended (writers.py); None for the probe's process."""
        process, life = self.log_engine.process_of(run, path), self.log_engine.life(run)
        if process is None or process.by != WRITER or (life is not None and life.ended):
            return None  # the probe's, or a run its logs ended meanwhile: nothing to ask
        zombie = self.processes.zombies.get((process.pid, process.pid_start))
        return self.writers.ending(process, zombie)

    def _released(self, run: str) -> None:
        life = self.log_engine.life(run)
        reason = life.reason if life is not None and life.ended else "run deleted"
        self.deliver(self.engine.finish(run, reason))
        self.deliver(self.log_engine.finish(run, "run deleted"))
        self.log_lines.forget(run)
        self.traces.forget(run)
        self.store.release_run(run)
        self.silence.forget(run)
        self.series_limit.forget(run)
        self.ranks.forget(run)
        self.writers.forget(run)

    def _on_cycle(self) -> None:
        if self._reload_requested:
            self._reload_requested = False
            self.reload()
        now = time.monotonic()
        if self.processes.enabled:
            self._check_processes(now)
        if now >= self._next_tick:  # deadlines are minutes; a busy loop cycles 100s of times/s
            self._next_tick = now + TICK_SECONDS
            self.deliver(self.engine.settle(time.time() - OPEN_STEP_SECONDS))
            if now >= self._next_clocks:
                self._next_clocks = now + max(TICK_SECONDS, self.engine.tick_every)
                ticked = self.engine.tick(self.silence.look(), self.silence.now_of)
                self.deliver(ticked)
                for t in ticked:  # a run whose data stopped is stalled, as its status says
                    if t.metric == RUN_WIDE:
                        self.deliver(self.log_engine.stalled(t.run, t.state == "firing"))
            if self.log_engine.hang.waiting:  # ranks' collective timeouts (rules/hang.py)
                self.deliver(self.log_engine.tick(time.time()))
                self._end_runs()
            self.notifier.tick()
        self.outbox.flush_held()
        self.heartbeat.beat()
        self.board.refresh(
            lambda: DaemonSnapshot.capture(
                self.daemon.stats,
                rules_loaded=len(self.engine.rules),
                firing=self.engine.firing() + self.log_engine.firing(),
                runs=self._runs(),
                directories_seen=self.daemon.stats.directories,
                saves=self.daemon.restart.stats if self.daemon.restart else None,
                values_dropped=self.series_limit.dropped,
                names_cut=names.cut_names,
                runs_refused=self.daemon.stats.runs_refused,
                nothing_readable=self.daemon.nothing_readable,
                unreadable=self.daemon.unreadable(),
            )
        )

    def _runs(self) -> list[RunStatus]:
        """The store's runs with the lives their logs tell; a run only its text logs name too."""
        lives = self.log_engine.lives()
        runs = [
            replace(r, state=life.state, cause=life.cause)
            if (life := lives.pop(r.run, None)) is not None and life.state != "running"
            else r
            for r in runs_of_store(self.store)
        ]
        for run, life in lives.items():
            runs.append(RunStatus(run, life.step, life.wall, 0, life.state, life.cause))
        runs = [replace(r, trace=trace) if (trace := self.traces.of(r.run)) else r for r in runs]
        host, namespace = self.processes.host, self.processes.namespace
        runs = [
            replace(r, watched=process.said())
            if (process := self.log_engine.watching(r.run, host, namespace)) is not None
            else r
            for r in runs
        ]
        saves = self.daemon.checkpoints()
        return [self._restarts(self._in_job(r), saves) for r in runs]

    def _restarts(self, status: RunStatus, saves: dict[str, tuple[int, float, str]]) -> RunStatus:
        """The run with its job's attempts and last good checkpoint (the checkpoint run's
        the rules hold its records against: rules/checkpoints.py)."""
        attempts = self.log_engine.attempts.of(status.run)
        job = self.log_engine.checkpoints.related(status.run) if saves else None
        saved = saves.get(job.run) if job is not None else saves.get(status.run)
        if attempts is None and saved is None:
            return status
        return replace(status, attempts=attempts, checkpoint=saved)

    def _in_job(self, status: RunStatus) -> RunStatus:
        """The run with its job, and for a rank what the fleet compares (store/ranks.py)."""
        member = member_of(status.run)
        rank = self.ranks.of(status.run)
        if rank is None:
            return replace(status, job=member.job)
        return replace(
            status,
            job=member.job,
            rank=rank.rank,
            attempt=rank.attempt,
            node=rank.node,
            step_seconds=rank.step_seconds,
            values=dict(rank.values),
            last_error=rank.last_error,
        )

    def _run_meta(self, run: str) -> dict[str, object]:
        directory = self.daemon.run_dir(run)
        life = self.log_engine.life(run)
        return {
            "run": run,
            "life": {"state": life.state, "cause": life.cause} if life else None,
            "trace": self.traces.of(run),
            "logs": self.log_lines.last(run),
            "dir": str(directory) if directory else None,
            "files": [str(p) for p in self.daemon.run_files(run)],
            "series": {
                tag: {"points": s.count, "segments": s.segment + 1, "last_step": s.last.step}
                for tag, s in sorted(self.store.series(run).items())
            },
        }

    # -- signals --------------------------------------------------------------

    def request_reload(self) -> None:
        """From the SIGHUP handler: the loop reloads between cycles, never mid-cycle."""
        self._reload_requested = True
        self.daemon.wake()

    def reload(self) -> None:
        """Re-read the config file and the rules; on any error keep what runs and say why."""
        self.systemd.reloading()
        try:
            fresh = self._reread()
            rules = load_rules(list(fresh.rules))
        except (ConfigError, RuleFileError) as exc:
            for err in exc.errors:
                print(err, file=sys.stderr)
            print("trainsentry: reload failed; the old rules keep running", file=sys.stderr)
        else:
            self.ruleset = rules
            self.deliver(self.engine.reload(rules))
            self.deliver(self.log_engine.reload(rules))
            self._next_clocks = 0.0  # the new rules' silences may be shorter
            print(f"trainsentry: reloaded {len(self.engine.rules)} rules", flush=True)
            if fresh != self.config:
                print(
                    "trainsentry: settings other than rules take effect on restart",
                    file=sys.stderr,
                )
        self.systemd.ready()

    # -- running --------------------------------------------------------------

    def start_http(self) -> None:
        http = self.config.http
        if not http.enabled:
            return
        view = LiveView(
            self.board,
            self.heartbeat.age,
            health_limit(HEARTBEAT_SECONDS),
            self.outbox.counts,
        )
        try:
            self.http = ApiServer(
                view,
                http.host,
                http.port,
                token=http.token,
                allow_unauthenticated=http.allow_unauthenticated,
            )
        except HttpApiError as exc:
            if http.explicit:
                raise ServiceError(str(exc)) from None
            print(f"trainsentry: no HTTP API: {exc}", file=sys.stderr)
            return
        self.http.start()

    def run(self) -> int:
        on_stop(self.daemon.stop)
        signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        self.start_http()
        where = ", ".join(str(r.top) for r in self.daemon.roots)
        api = f", API on http://{self.config.http.address}" if self.http else ""
        n = len(self.engine.rules)
        print(
            f"trainsentry {__version__}: watching {where} with {n} rule{'' if n == 1 else 's'} "
            f"(state in {self.state_dir}{api}; {self.config.describe()})",
            flush=True,
        )
        for lane in self.notifier.lanes.values():
            if lane.route.kind != "command":
                print(f"trainsentry: notifying {lane.sink.name}", flush=True)
        self.notifier.start()
        if self.memory.restored is not None:
            self.deliver(self.memory.restored)
        guard = StuckLoopGuard(self.heartbeat, STUCK_SECONDS)
        guard.start()
        self.systemd.ready(f"watching {where}")
        try:
            self.daemon.run_forever()
        finally:
            self.systemd.stopping()
            guard.stop()
            if self.http is not None:
                self.http.close()
            self.printer.close()
            self.notifier.close()
        self.lock.release()
        hidden = self.printer.hidden
        note = f", {hidden} historical transition(s) not shown" if hidden else ""
        print(
            f"trainsentry: stopped after reading {self.daemon.stats.points} points "
            f"from {self.daemon.stats.files} files{note}",
            flush=True,
        )
        return 0
