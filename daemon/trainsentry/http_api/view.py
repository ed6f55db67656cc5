"""What the HTTP endpoints see of the daemon: a published snapshot, never its live state.

The main loop owns the engine, the store and the tails, none of which is
thread-safe; an HTTP thread iterating them while a cycle adds a run would
crash with "dictionary changed size during iteration" or read half an
update. So the loop *publishes* an immutable `DaemonSnapshot` (from its cycle
hook, when a reader asks: `SnapshotBoard`), and the server only ever reads the
latest one — one reference, assigned atomically. Ages (lag per run, heartbeat age) are
computed at request time from the snapshot's wall times, so they keep growing
when the loop stops publishing: a stuck loop shows as growing lag, not as a
frozen, healthy-looking page.

`DaemonView` is the whole seam between the server and the daemon. `LiveView`
implements it from a `SnapshotBoard`, a `Heartbeat` and the notifier's
counts; tests implement it with a few lines.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainsentry.alert import Transition


@dataclass(frozen=True, slots=True)
class RunStatus:
    """One run as `trainsentry status` shows it: where it is and when it last wrote."""

    run: str
    last_step: int
    last_wall_time: float  # the writer's wall time of its newest point
    series: int = 0
    # its life (rules/run_life.py): running, stalled, crashed, preempted, cancelled, finished,
    # exited
    state: str = "running"
    cause: str = ""
    # what it was started with, by section: MLflow's params and tags, W&B's config
    trace: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # its job, and its rank and attempt of it where it is one (jobs/identity.py); for a rank
    # what the fleet's Prometheus compares (store/ranks.py)
    job: str = ""
    rank: int | None = None
    attempt: int | None = None
    node: str = ""
    step_seconds: float = math.nan  # the rank's recent pace, seconds per step
    # the latest of each exported series, by (series, source: "probe" or "log")
    values: Mapping[tuple[str, str], float] = field(default_factory=dict)
    last_error: str = ""
    # the process whose end would end it, on the daemon's host (rules/run_life.py said):
    # {"by": "probe" | "writer", "pid", "host", and a writer's "command" and "file"}
    watched: Mapping[str, object] = field(default_factory=dict)
    # its job's attempts across restarts (rules/attempts.py): (begun, the one it is in now)
    attempts: tuple[int, int] | None = None
    # its job's last good checkpoint, complete and not partial (sources/checkpoints.py):
    # (step, completion wall time, path)
    checkpoint: tuple[int, float, str] | None = None


@dataclass(frozen=True, slots=True)
class DaemonSnapshot:
    """Counters and state of one moment of the main loop. Counters only ever grow."""

    taken_at: float = 0.0  # time.time() when captured
    points_read: int = 0
    records_skipped: int = 0  # corrupt or partial records skipped and counted
    files_followed: int = 0
    cycles: int = 0
    rules_loaded: int = 0
    directories_seen: int | None = None  # None: unknown (compare with inotify watches)
    values_dropped: int = 0  # values of tags beyond a run's series limit
    names_cut: int = 0  # tag and run names shortened to the name limit
    runs_refused: int = 0  # runs not followed: the daemon follows its limit of runs
    points_relearned: int = 0
    state_saves: int = 0
    state_save_failures: int = 0
    state_saved_at: float | None = None
    state_save_seconds: float = 0.0
    state_bytes: int = 0
    runs: tuple[RunStatus, ...] = ()
    alerts: tuple[Transition, ...] = field(default=())
    nothing_readable: tuple[
        str, ...
    ] = ()  # a line per watched path with no log read  # firing now, as Engine.firing() reads
    # the paths that cannot be read now: (path, its run or "" for a directory, why)
    unreadable: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def capture(
        cls,
        stats: Any,
        *,
        rules_loaded: int,
        firing: Sequence[Transition],
        runs: Iterable[RunStatus],
        directories_seen: int | None = None,
        saves: Any = None,
        values_dropped: int = 0,
        names_cut: int = 0,
        runs_refused: int = 0,
        now: float | None = None,
        nothing_readable: Sequence[str] = (),
        unreadable: Sequence[tuple[str, str, str]] = (),
    ) -> DaemonSnapshot:
        """From the loop's `Stats` (points, records skipped), the restart's `SaveStats`
        (alert-state snapshots; None when nothing is saved) and the rest."""
        return cls(
            taken_at=time.time() if now is None else now,
            points_read=int(stats.points),
            records_skipped=int(stats.skipped_records),
            files_followed=int(stats.files),
            cycles=int(stats.cycles),
            rules_loaded=rules_loaded,
            directories_seen=directories_seen,
            values_dropped=values_dropped,
            names_cut=names_cut,
            runs_refused=runs_refused,
            points_relearned=int(stats.relearned),
            state_saves=int(saves.saves) if saves else 0,
            state_save_failures=int(saves.failures) if saves else 0,
            state_saved_at=saves.saved_at if saves else None,
            state_save_seconds=float(saves.seconds) if saves else 0.0,
            state_bytes=int(saves.bytes) if saves else 0,
            runs=tuple(runs),
            alerts=tuple(firing),
            nothing_readable=tuple(nothing_readable),
            unreadable=tuple(unreadable),
        )


def runs_of_store(store: Any) -> list[RunStatus]:
    """Each run's newest step and wall time over its series (a `trainsentry.store.Store`)."""
    return [RunStatus(*row) for row in store.newest()]


class DaemonView(Protocol):
    """All the HTTP server (and /metrics) asks of the daemon. Called from server threads."""

    def snapshot(self) -> DaemonSnapshot:
        """The latest snapshot: at most a second old if the loop publishes within a second
        (a stuck loop leaves the old one, whose ages keep growing)."""
        ...

    def heartbeat_age(self) -> float:
        """Seconds since the main loop last completed a cycle."""
        ...

    def heartbeat_limit(self) -> float:
        """/healthz fails (503) when `heartbeat_age()` is above this."""
        ...

    def notification_counts(self) -> Mapping[str, int]:
        """Notifications by state: `queued`, `sent`, `failed` (missing keys read as 0)."""
        ...


class SnapshotBoard:
    """Where the main loop pins its latest snapshot for other threads to read.

    Published when someone asks, not every second: a snapshot of a thousand
    runs costs the loop ~3 ms (3 % of a fleet's daemon CPU once a second)
    and is read by a scrape every 15 s or a `trainsentry status`. A reader
    that finds it older than `fresh_within` asks, wakes the loop (`on_ask`)
    and waits at most `wait` seconds for the next cycle to publish; a stuck
    loop leaves it the old snapshot, whose ages keep growing. Unasked, the
    loop still publishes every `idle_interval`.
    """

    def __init__(
        self,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        idle_interval: float = 10.0,
        wait: float = 1.0,
    ):
        self.min_interval = min_interval
        self.idle_interval = idle_interval
        self.wait = wait
        self.on_ask: Callable[[], None] = lambda: None  # e.g. `Daemon.wake`
        self._clock = clock
        self._latest = DaemonSnapshot()
        self._published_at = -float("inf")
        self._asked = False
        self._published = threading.Condition()

    def publish(self, snapshot: DaemonSnapshot) -> None:
        with self._published:
            self._latest = snapshot
            self._published_at = self._clock()
            self._asked = False
            self._published.notify_all()

    def refresh(self, capture: Callable[[], DaemonSnapshot]) -> bool:
        """Publish `capture()` if a reader asked (or `idle_interval` passed), at most
        once per `min_interval`. Called every cycle; True when it published."""
        age = self._clock() - self._published_at
        if age < self.min_interval or (age < self.idle_interval and not self._asked):
            return False
        self.publish(capture())
        return True

    def latest(self, fresh_within: float | None = None) -> DaemonSnapshot:
        """The latest snapshot; with `fresh_within`, one at most that old if the loop
        publishes one within `wait` seconds."""
        if fresh_within is None:
            return self._latest

        def fresh() -> bool:
            return self._clock() - self._published_at <= fresh_within

        with self._published:
            if fresh():
                return self._latest
            self._asked = True
        self.on_ask()
        with self._published:
            self._published.wait_for(fresh, timeout=self.wait)
            return self._latest


@dataclass
class LiveView:
    """`DaemonView` from the pieces the runtime already has."""

    board: SnapshotBoard
    heartbeat_age: Callable[[], float]  # e.g. `Heartbeat.age`
    limit: float  # e.g. `systemd.health_limit(cycle_interval)`
    notifications: Callable[[], Mapping[str, int]] = dict  # e.g. `Outbox.counts`

    def snapshot(self) -> DaemonSnapshot:
        return self.board.latest(fresh_within=self.board.min_interval)

    def heartbeat_limit(self) -> float:
        return self.limit

    def notification_counts(self) -> Mapping[str, int]:
        return self.notifications()


# --- the JSON documents of /api/runs and /api/alerts -----------------------


def _age(now: float, wall: float) -> float | None:
    return round(max(0.0, now - wall), 3) if math.isfinite(wall) else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN or infinity


def runs_document(snapshot: DaemonSnapshot, now: float) -> dict[str, Any]:
    """`{"now", "runs": [{run, last_step, last_wall_time, age_seconds, series, firing, state,
    cause, trace, watched, attempts: {count, current}, checkpoint: {step, path, wall_time,
    age_seconds}, and `unreadable`: [{path, reason}] where a file of it cannot be read}],
    "nothing_readable": [a line per watched path that holds no log read], "unreadable":
    [{path, run, reason}]}`. A run known only by a file that cannot be read (a store of
    random bytes) is listed, its state `unreadable` and its cause why."""
    firing: dict[str, list[dict[str, str]]] = {}
    for t in sorted(snapshot.alerts, key=lambda t: (t.severity != "critical", t.rule, t.metric)):
        firing.setdefault(t.run, []).append(
            {"rule": t.rule, "severity": t.severity, "metric": t.metric}
        )
    runs = [
        {
            "run": r.run,
            "last_step": r.last_step,
            "last_wall_time": _finite(r.last_wall_time),
            "age_seconds": _age(now, r.last_wall_time),
            "series": r.series,
            "firing": firing.pop(r.run, []),
            "state": r.state,
            "cause": r.cause,
            "trace": {name: dict(entries) for name, entries in r.trace.items()},
            "watched": dict(r.watched) or None,
            "attempts": _attempts(r.attempts),
            "checkpoint": _checkpoint(now, r.checkpoint),
            **_job_keys(r),
        }
        for r in sorted(snapshot.runs, key=lambda r: r.run)
    ]
    for run, alerts in sorted(firing.items()):  # alerts of a run the store no longer holds
        runs.append(
            {
                "run": run,
                "last_step": None,
                "last_wall_time": None,
                "age_seconds": None,
                "series": 0,
                "firing": alerts,
            }
        )
    by_run = {r["run"]: r for r in runs}
    for path, run, why in snapshot.unreadable:
        if not run:
            continue
        doc = by_run.get(run)
        if doc is None:  # nothing read of it: it is what cannot be read
            doc = by_run[run] = {
                "run": run, "last_step": None, "last_wall_time": None, "age_seconds": None,
                "series": 0, "firing": [], "state": "unreadable", "cause": why,
            }  # fmt: skip
            runs.append(doc)
        doc.setdefault("unreadable", []).append({"path": path, "reason": why})
    return {
        "now": now,
        "runs": runs,
        "jobs": jobs_of(runs),
        "nothing_readable": list(snapshot.nothing_readable),
        "unreadable": [
            {"path": path, "run": run or None, "reason": why}
            for path, run, why in snapshot.unreadable
        ],
    }


def _attempts(attempts: tuple[int, int] | None) -> dict[str, int] | None:
    return None if attempts is None else {"count": attempts[0], "current": attempts[1]}


def _checkpoint(now: float, saved: tuple[int, float, str] | None) -> dict[str, Any] | None:
    if saved is None:
        return None
    step, wall, path = saved
    return {"step": step, "path": path, "wall_time": _finite(wall), "age_seconds": _age(now, wall)}


def _job_keys(r: RunStatus) -> dict[str, Any]:
    out: dict[str, Any] = {"job": r.job or r.run}
    if r.rank is not None:
        out.update(rank=r.rank, attempt=r.attempt, node=r.node)
        out["step_seconds"] = _finite(r.step_seconds)
        if r.last_error:
            out["last_error"] = r.last_error
    return out


def jobs_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs of more than one run, each with its ranks in rank order and its runs: what
    `status` shows as a job. A run alone is no job to show. A job's `attempts` and
    `checkpoint` are its runs' (the most attempts told, the newest checkpoint)."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_job.setdefault(run.get("job") or run["run"], []).append(run)
    out = []
    for job, members in sorted(by_job.items()):
        ranks = sorted(
            (r for r in members if "rank" in r), key=lambda r: (r["attempt"] or 0, r["rank"])
        )
        if len(members) < 2 and not ranks:
            continue
        states = sorted({r.get("state", "running") for r in members})
        out.append(
            {
                "job": job,
                "runs": [r["run"] for r in members],
                "ranks": [
                    {k: r.get(k) for k in ("run", "rank", "attempt", "node", "last_step", "state")}
                    for r in ranks
                ],
                "states": states,
                "firing": sum(len(r.get("firing", ())) for r in members),
                "attempts": max(
                    (a for r in members if (a := r.get("attempts"))),
                    key=lambda a: (a["count"], a["current"]),
                    default=None,
                ),
                "checkpoint": max(
                    (c for r in members if (c := r.get("checkpoint"))),
                    key=lambda c: (c["step"], c["wall_time"] or 0.0),
                    default=None,
                ),
            }
        )
    return out


def alerts_document(
    snapshot: DaemonSnapshot, now: float, notifications: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """`{"now", "alerts": [the alert line of DESIGN.md, plus age_seconds], "notifications":
    {queued, sent, failed}}`, criticals first: `failed` are notifications given up."""
    alerts = []
    for t in sorted(snapshot.alerts, key=lambda t: (t.severity != "critical", t.run, t.rule)):
        doc = t.as_dict()
        wall = doc.get("wall_time")
        doc["age_seconds"] = _age(now, wall) if isinstance(wall, float | int) else None
        alerts.append(doc)
    counts = {s: int((notifications or {}).get(s, 0)) for s in ("queued", "sent", "failed")}
    return {"now": now, "alerts": alerts, "notifications": counts}
