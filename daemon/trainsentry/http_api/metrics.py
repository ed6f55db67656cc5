"""/metrics: the daemon's own health in Prometheus' format, read at scrape time.

Nothing is counted twice: the runtime already keeps its counters (`Stats`),
the engine knows what fires, the outbox knows what is queued. A custom
collector turns the latest published `DaemonSnapshot` into metric families
when Prometheus scrapes, so the hot path pays nothing for being observed and
no counter can drift from the number `trainsentry status` shows.

Each server gets its own `CollectorRegistry` (not prometheus-client's global
one), so two daemons in one test process, or a reloaded server, never clash.

Watches are measured, not assumed: watchdog does not say how many inotify
watches it holds, and when the kernel's limit is reached it leaves part of
the tree unwatched without a word. The kernel does say — one `inotify wd:`
line per watch in /proc/self/fdinfo of each inotify descriptor — so
`trainsentry_inotify_watches` against `trainsentry_directories_seen` is an
alertable "part of the tree is deaf" signal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainsentry import __version__
from trainsentry.http_api.view import DaemonSnapshot, DaemonView
from trainsentry.watching.kernel import inotify_watch_limit, inotify_watches

__all__ = ["DaemonCollector", "inotify_watch_limit", "inotify_watches", "make_registry"]

NOTIFICATION_STATES = ("queued", "sent", "failed")
SEVERITIES = ("warning", "critical")


class DaemonCollector(Collector):
    """The trainsentry_* families, built from a `DaemonView` on each scrape."""

    def __init__(self, view: DaemonView, clock: Callable[[], float] = time.time) -> None:
        self._view = view
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []  # families vary with the snapshot; an empty describe keeps registration lazy

    def collect(self) -> Iterator[Metric]:
        snap = self._view.snapshot()
        now = self._clock()

        info = GaugeMetricFamily(
            "trainsentry_build_info", "Always 1; the version as a label.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info

        yield CounterMetricFamily(
            "trainsentry_points_read", "Points read from log files.", value=snap.points_read
        )
        yield CounterMetricFamily(
            "trainsentry_records_skipped",
            "Corrupt or unreadable records skipped (parse errors); each is logged.",
            value=snap.records_skipped,
        )
        yield CounterMetricFamily(
            "trainsentry_cycles", "Main-loop cycles completed.", value=snap.cycles
        )
        yield from _alert_state(snap)
        yield GaugeMetricFamily(
            "trainsentry_files_followed", "Log files being tailed.", value=snap.files_followed
        )
        yield GaugeMetricFamily(
            "trainsentry_runs", "Runs with at least one point in memory.", value=len(snap.runs)
        )
        yield GaugeMetricFamily(
            "trainsentry_rules_loaded",
            "Rules loaded (after the last reload).",
            value=snap.rules_loaded,
        )
        yield CounterMetricFamily(
            "trainsentry_values_dropped",
            "Values of new tags of runs past their series limit, dropped.",
            value=snap.values_dropped,
        )
        yield CounterMetricFamily(
            "trainsentry_names_cut",
            "Tag and run names longer than the name limit, shortened.",
            value=snap.names_cut,
        )
        yield GaugeMetricFamily(
            "trainsentry_paths_unreadable",
            "Log files, stores and directories that cannot be read now (permissions, a "
            "store that is none); each is named in the daemon's log and in status.",
            value=len(snap.unreadable),
        )
        yield CounterMetricFamily(
            "trainsentry_runs_refused",
            "Runs not followed because the daemon already follows its limit of runs.",
            value=snap.runs_refused,
        )

        firing = GaugeMetricFamily(
            "trainsentry_alerts_firing", "Alerts firing now, by severity.", labels=["severity"]
        )
        counts = dict.fromkeys(SEVERITIES, 0)
        for t in snap.alerts:
            counts[t.severity] = counts.get(t.severity, 0) + 1
        for severity, n in sorted(counts.items()):
            firing.add_metric([severity], n)
        yield firing

        notifications = GaugeMetricFamily(
            "trainsentry_notifications",
            "Notifications in the outbox by state: queued (waiting or retrying), "
            "sent and failed (kept for a week).",
            labels=["state"],
        )
        by_state = self._view.notification_counts()
        for state in NOTIFICATION_STATES:
            notifications.add_metric([state], by_state.get(state, 0))
        yield notifications

        lag = GaugeMetricFamily(
            "trainsentry_run_lag_seconds",
            "Now minus the wall time of the run's newest point.",
            labels=["run"],
        )
        last_step = GaugeMetricFamily(
            "trainsentry_run_last_step", "The run's newest step.", labels=["run"]
        )
        # one series a run, for its state now (rules/run_life.py): a run that changes state
        # leaves the old series, so `trainsentry_run_state{state="crashed"}` lists crashes
        life = GaugeMetricFamily(
            "trainsentry_run_state",
            "1 for the run's state: running, stalled, finished, crashed, preempted, cancelled,"
            " exited.",
            labels=["run", "state"],
        )
        for r in snap.runs:
            lag.add_metric([r.run], max(0.0, now - r.last_wall_time))
            last_step.add_metric([r.run], r.last_step)
            life.add_metric([r.run, r.state], 1)
        yield lag
        yield last_step
        yield life
        yield from _ranks(snap)

        yield GaugeMetricFamily(
            "trainsentry_heartbeat_age_seconds",
            "Seconds since the main loop last completed a cycle (/healthz fails past the limit).",
            value=self._view.heartbeat_age(),
        )
        yield GaugeMetricFamily(
            "trainsentry_heartbeat_limit_seconds",
            "The heartbeat age beyond which the loop counts as stuck.",
            value=self._view.heartbeat_limit(),
        )
        yield from self._watches(snap.directories_seen)

    def _watches(self, directories: int | None) -> Iterator[Metric]:
        if directories is not None:
            yield GaugeMetricFamily(
                "trainsentry_directories_seen",
                "Directories under the watched roots; more than the watches means some are deaf.",
                value=directories,
            )
        watches = inotify_watches()
        if watches is not None:
            yield GaugeMetricFamily(
                "trainsentry_inotify_watches",
                "inotify watches this process holds (from /proc/self/fdinfo).",
                value=watches,
            )
        limit = inotify_watch_limit()
        if limit is not None:
            yield GaugeMetricFamily(
                "trainsentry_inotify_watch_limit",
                "fs.inotify.max_user_watches: shared by every process of this user.",
                value=limit,
            )


# Rank series one daemon exports at most: a daemon beside a node follows its 8 ranks, one
# on a shared filesystem a cluster's; past this many a scrape would be megabytes. The
# rest are counted (`trainsentry_ranks_not_exported`); split such a root with --shard.
MAX_EXPORTED_RANKS = 10_000
RANK_LABELS = ["job", "rank", "node", "attempt", "run"]
LIVE = ("running", "stalled")  # a finished or crashed rank is no rank of a running job


def _ranks(snap: DaemonSnapshot) -> Iterator[Metric]:
    """Each rank of a running job this daemon follows, labelled so that a fleet's
    Prometheus joins a job's ranks across nodes (deploy/prometheus/, docs/fleet.md)."""
    step = GaugeMetricFamily("trainsentry_rank_step", "The rank's newest step.", labels=RANK_LABELS)
    stamp = GaugeMetricFamily(
        "trainsentry_rank_step_timestamp_seconds",
        "The writer's wall time (Unix seconds) of the rank's newest step.",
        labels=RANK_LABELS,
    )
    pace = GaugeMetricFamily(
        "trainsentry_rank_step_duration_seconds",
        "Seconds per step over the rank's recent logged intervals (median).",
        labels=RANK_LABELS,
    )
    values = GaugeMetricFamily(
        "trainsentry_rank_value",
        "The rank's latest value of a series compared across ranks (data_wait, forward_time,"
        " step_time, loss, grad_norm, gpu_util), from the probe or the job's own logs.",
        labels=[*RANK_LABELS, "series", "source"],
    )
    errors = GaugeMetricFamily(
        "trainsentry_rank_last_error_info",
        "Always 1; the rank's latest error line (masked, cut) as a label.",
        labels=[*RANK_LABELS, "line"],
    )
    ranks = [r for r in snap.runs if r.rank is not None and r.state in LIVE]
    for r in ranks[:MAX_EXPORTED_RANKS]:
        labels = [r.job, str(r.rank), r.node, str(r.attempt or 0), r.run]
        step.add_metric(labels, r.last_step)
        if math.isfinite(r.last_wall_time):
            stamp.add_metric(labels, r.last_wall_time)
        if math.isfinite(r.step_seconds):
            pace.add_metric(labels, r.step_seconds)
        for (series, source), value in sorted(r.values.items()):
            values.add_metric([*labels, series, source], value)
        if r.last_error:
            errors.add_metric([*labels, r.last_error], 1)
    yield from (step, stamp, pace, values, errors)
    yield GaugeMetricFamily(
        "trainsentry_ranks_not_exported",
        f"Ranks of running jobs beyond the {MAX_EXPORTED_RANKS} one daemon exports.",
        value=max(0, len(ranks) - MAX_EXPORTED_RANKS),
    )


def make_registry(
    view: DaemonView, *, process: bool = True, clock: Callable[[], float] = time.time
) -> CollectorRegistry:
    """A registry with the daemon's families and, by default, process CPU/RSS/fds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(view, clock))
    if process:
        ProcessCollector(registry=registry)
    return registry


def _alert_state(snap: DaemonSnapshot) -> Iterator[Metric]:
    """Saving the alert state (snapshot.py): a save that keeps failing (a full disk)
    means the next crash relearns more, and `time() - saved_timestamp` says how much."""
    yield CounterMetricFamily(
        "trainsentry_points_relearned",
        "Points read again after a restart to rebuild the alert state (told no one).",
        value=snap.points_relearned,
    )
    yield CounterMetricFamily(
        "trainsentry_alert_state_saves", "Alert-state snapshots written.", value=snap.state_saves
    )
    yield CounterMetricFamily(
        "trainsentry_alert_state_save_failures",
        "Alert-state snapshots that could not be written (each is logged).",
        value=snap.state_save_failures,
    )
    if snap.state_saved_at is not None:
        yield GaugeMetricFamily(
            "trainsentry_alert_state_saved_timestamp_seconds",
            "When the last alert-state snapshot was written (Unix time).",
            value=snap.state_saved_at,
        )
    yield GaugeMetricFamily(
        "trainsentry_alert_state_save_duration_seconds",
        "How long writing the last alert-state snapshot took (the main loop waits for it).",
        value=snap.state_save_seconds,
    )
    yield GaugeMetricFamily(
        "trainsentry_alert_state_bytes",
        "Size of the last alert-state snapshot.",
        value=snap.state_bytes,
    )
