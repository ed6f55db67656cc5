"""The HTTP API over real requests to 127.0.0.1: /metrics, /healthz, /api/*, tokens, status."""

from __future__ import annotations

import ctypes
import json
import math
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.pty_process import TtyBuffer, plain, terminal_env

from trainsentry.alert import Transition
from trainsentry.http_api import (
    ApiServer,
    DaemonSnapshot,
    HttpApiError,
    LiveView,
    RunStatus,
    SnapshotBoard,
    StatusError,
    fetch_status,
    is_loopback,
    runs_of_store,
)
from trainsentry.http_api.client import base_url
from trainsentry.http_api.metrics import inotify_watches
from trainsentry.http_api.view import alerts_document, runs_document
from trainsentry.point import Point
from trainsentry.runtime.loop import Stats
from trainsentry.runtime.systemd import Heartbeat, health_limit
from trainsentry.store import Store
from trainsentry.terminal import render as console
from trainsentry.terminal.plain import format_age, loaded, render_status

NOW = 1_800_000_000.0


def firing(run: str, rule: str, severity: str, value: float = 57.1) -> Transition:
    return Transition(
        run=run, rule=rule, severity=severity, state="firing", step=1234,
        wall_time=NOW - 30, metric="train/grad_norm", value=value,
        message=f"{rule} on {run}",
    )  # fmt: skip


SNAPSHOT = DaemonSnapshot(
    taken_at=NOW,
    points_read=5000,
    records_skipped=3,
    files_followed=4,
    cycles=17,
    rules_loaded=12,
    values_dropped=7,
    directories_seen=9,
    runs=(RunStatus("exp1/seed0", 1234, NOW - 30, 20), RunStatus("exp2/seed0", 99, NOW - 7200, 3)),
    alerts=(
        firing("exp1/seed0", "grad_norm_growth", "critical"),
        firing("exp1/seed0", "loss_nan", "warning", value=math.nan),
    ),
)


@dataclass
class FakeView:
    """A DaemonView without a daemon: tests set what the loop would have published."""

    snap: DaemonSnapshot = SNAPSHOT
    age: float = 1.0
    limit: float = 90.0
    counts: dict[str, int] = field(default_factory=lambda: {"queued": 2, "sent": 40})

    def snapshot(self) -> DaemonSnapshot:
        return self.snap

    def heartbeat_age(self) -> float:
        return self.age

    def heartbeat_limit(self) -> float:
        return self.limit

    def notification_counts(self) -> Mapping[str, int]:
        return self.counts


def serve(view: FakeView, token: str | None = None) -> ApiServer:
    server = ApiServer(view, "127.0.0.1", 0, token=token, clock=lambda: NOW, poll_interval=0.02)
    server.start()
    return server


def served_documents(view: FakeView) -> tuple[Any, Any]:
    """/api/runs and /api/alerts as a server of `view` serves them."""
    server = serve(view)
    try:
        runs = strict_json(get(f"{server.url}/api/runs")[2])
        alerts = strict_json(get(f"{server.url}/api/alerts")[2])
    finally:
        server.close()
    return runs, alerts


@pytest.fixture
def view() -> FakeView:
    return FakeView()


@pytest.fixture
def server(view: FakeView) -> Iterator[ApiServer]:
    server = serve(view)
    yield server
    server.close()


def get(url: str, token: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def strict_json(text: str) -> Any:
    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constants)


def test_metrics_are_served_in_prometheus_format(server: ApiServer) -> None:
    status, content_type, body = get(f"{server.url}/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("trainsentry_points_read_total", ())] == 5000
    assert samples[("trainsentry_records_skipped_total", ())] == 3
    assert samples[("trainsentry_values_dropped_total", ())] == 7
    assert samples[("trainsentry_rules_loaded", ())] == 12
    assert samples[("trainsentry_alerts_firing", (("severity", "critical"),))] == 1
    assert samples[("trainsentry_alerts_firing", (("severity", "warning"),))] == 1
    assert samples[("trainsentry_notifications", (("state", "queued"),))] == 2
    assert samples[("trainsentry_notifications", (("state", "failed"),))] == 0
    assert samples[("trainsentry_run_lag_seconds", (("run", "exp2/seed0"),))] == 7200
    assert samples[("trainsentry_run_last_step", (("run", "exp1/seed0"),))] == 1234
    assert samples[("trainsentry_run_state", (("run", "exp1/seed0"), ("state", "running")))] == 1
    assert samples[("trainsentry_directories_seen", ())] == 9
    assert samples[("trainsentry_heartbeat_age_seconds", ())] == 1.0
    assert ("trainsentry_build_info", (("version", "0.1.0"),)) in samples
    if sys.platform == "linux":
        assert ("trainsentry_inotify_watches", ()) in samples
        assert ("process_resident_memory_bytes", ()) in samples


def test_each_runs_state_is_one_series_of_metrics(view: FakeView) -> None:
    crashed = RunStatus("exp2/seed0", 99, NOW - 7200, 3, "crashed", "CUDA out of memory")
    view.snap = replace(SNAPSHOT, runs=(SNAPSHOT.runs[0], crashed))
    server = serve(view)
    try:
        body = get(f"{server.url}/metrics")[2]
    finally:
        server.close()
    states = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "trainsentry_run_state"
    }
    assert states == {
        (("run", "exp1/seed0"), ("state", "running")): 1,
        (("run", "exp2/seed0"), ("state", "crashed")): 1,
    }


def test_openmetrics_is_served_when_asked_for(server: ApiServer) -> None:
    request = urllib.request.Request(
        f"{server.url}/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.read().decode().rstrip().endswith("# EOF")


def test_healthz_fails_when_the_loop_has_not_cycled_for_too_long(
    server: ApiServer, view: FakeView
) -> None:
    status, _, body = get(f"{server.url}/healthz")
    assert status == 200 and strict_json(body)["status"] == "ok"
    view.age = 91.0
    status, _, body = get(f"{server.url}/healthz")
    doc = strict_json(body)
    assert status == 503 and doc["status"] == "stuck" and doc["limit_seconds"] == 90.0
    assert doc["error"] == "the main loop has not completed a cycle for 91s"


def test_api_runs_lists_each_run_with_its_age_and_firing_alerts(server: ApiServer) -> None:
    status, content_type, body = get(f"{server.url}/api/runs")
    assert status == 200 and content_type == "application/json"
    doc = strict_json(body)
    assert doc["now"] == NOW
    first, second = doc["runs"]
    assert first == {
        "run": "exp1/seed0",
        "last_step": 1234,
        "last_wall_time": NOW - 30,
        "age_seconds": 30.0,
        "series": 20,
        "firing": [
            {"rule": "grad_norm_growth", "severity": "critical", "metric": "train/grad_norm"},
            {"rule": "loss_nan", "severity": "warning", "metric": "train/grad_norm"},
        ],
        "state": "running",
        "cause": "",
        "trace": {},
        "watched": None,
        "attempts": None,
        "checkpoint": None,
        "job": "exp1/seed0",
    }
    assert second["run"] == "exp2/seed0" and second["firing"] == []


def test_api_runs_and_status_say_a_jobs_attempts_and_its_last_good_checkpoint(
    view: FakeView, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal_env(monkeypatch)
    saved = (500, NOW - 720, "/ckpt/out/checkpoint-500")
    view.snap = replace(
        SNAPSHOT,
        runs=(
            RunStatus("out", 520, NOW - 3, 4, checkpoint=saved),
            RunStatus("out/runs/may01", 520, NOW - 3, 9, job="out", attempts=(3, 3),
                      checkpoint=saved),
            RunStatus("once", 10, NOW - 1, 1, attempts=(1, 1)),
        ),
    )  # fmt: skip
    runs, alerts = served_documents(view)
    by_run = {r["run"]: r for r in runs["runs"]}
    resumed = by_run["out/runs/may01"]
    assert resumed["attempts"] == {"count": 3, "current": 3}
    assert resumed["checkpoint"] == {
        "step": 500, "path": "/ckpt/out/checkpoint-500", "wall_time": NOW - 720,
        "age_seconds": 720.0,
    }  # fmt: skip
    assert by_run["out"]["attempts"] is None and by_run["once"]["checkpoint"] is None
    [job] = runs["jobs"]
    assert job["attempts"] == {"count": 3, "current": 3}
    assert job["checkpoint"]["path"] == "/ckpt/out/checkpoint-500"
    lines = render_status(runs, alerts).splitlines()
    out = TtyBuffer()
    console.print_status(console.console_for(out), *loaded(runs, alerts))
    on_terminal = plain(out.getvalue())
    assert "out/runs/may01 [attempt 3 of 3]" in on_terminal
    assert "out: last good checkpoint step 500, 12m ago: /ckpt/out/checkpoint-500" in on_terminal
    assert any(line.startswith("out/runs/may01 [attempt 3 of 3] ") for line in lines)
    assert any(line.startswith("once ") for line in lines)  # one attempt is none to say
    assert "out: last good checkpoint step 500, 12m ago: /ckpt/out/checkpoint-500" in lines


def test_api_runs_and_status_say_which_process_is_watched_for_a_run() -> None:
    writer = {"by": "writer", "pid": 4242, "host": "gpu-7", "command": "python train.py",
              "file": "/logs/plain/metrics.jsonl"}  # fmt: skip
    runs = (
        RunStatus("plain", 10, NOW - 1, 1, watched=writer),
        RunStatus("probed", 10, NOW - 1, 1, watched={"by": "probe", "pid": 77, "host": "gpu-7"}),
        RunStatus("quiet", 10, NOW - 1, 1, "stalled", watched=writer),
        RunStatus("elsewhere", 10, NOW - 1, 1),
    )
    doc = runs_document(replace(SNAPSHOT, runs=runs, alerts=()), NOW)
    by_run = {r["run"]: r for r in doc["runs"]}
    assert by_run["plain"]["watched"] == writer
    assert by_run["probed"]["watched"] == {"by": "probe", "pid": 77, "host": "gpu-7"}
    assert by_run["elsewhere"]["watched"] is None
    labels = [line.split("  ")[0] for line in render_status(doc, {"alerts": []}).splitlines()]
    assert labels[1:5] == [
        "elsewhere",
        "plain [process 4242: python train.py]",
        "probed [probe: process 77]",
        "quiet [process 4242: python train.py] (stalled)",
    ]


def test_api_runs_and_status_show_what_cannot_be_read_and_whose_it_is() -> None:
    unreadable = (
        ("/logs/store/mlflow.db", "store", "not a SQLite database"),
        ("/logs/exp1/seed0/extra.log", "exp1/seed0", "cannot open: Permission denied"),
        ("/logs/private", "", "Permission denied"),
    )
    doc = runs_document(replace(SNAPSHOT, unreadable=unreadable, alerts=()), NOW)
    by_run = {r["run"]: r for r in doc["runs"]}
    assert (by_run["store"]["state"], by_run["store"]["cause"]) == (
        "unreadable",
        "not a SQLite database",
    )
    assert by_run["exp1/seed0"]["state"] == "running"  # its other files are read
    assert by_run["exp1/seed0"]["unreadable"] == [
        {"path": "/logs/exp1/seed0/extra.log", "reason": "cannot open: Permission denied"}
    ]
    assert [x["run"] for x in doc["unreadable"]] == ["store", "exp1/seed0", None]
    lines = render_status(json.loads(json.dumps(doc)), {"alerts": []}).splitlines()
    assert any(line.startswith("store (unreadable: not a SQLite database)") for line in lines)
    assert "cannot read /logs/store/mlflow.db: not a SQLite database" in lines
    assert "cannot read /logs/private: Permission denied" in lines


def test_api_alerts_are_the_alert_lines_and_always_valid_json(server: ApiServer) -> None:
    doc = strict_json(get(f"{server.url}/api/alerts")[2])
    critical, warning = doc["alerts"]
    assert critical["rule"] == "grad_norm_growth" and critical["severity"] == "critical"
    assert critical["state"] == "firing" and critical["age_seconds"] == 30.0
    assert warning["value"] == "nan"  # the evidence kept, as text: JSON has no NaN


def test_unknown_paths_and_writes_are_refused(server: ApiServer) -> None:
    assert get(f"{server.url}/nope")[0] == 404
    request = urllib.request.Request(f"{server.url}/api/runs", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
    assert info.value.code == 405


def test_a_token_is_required_everywhere_but_healthz(view: FakeView) -> None:
    server = serve(view, token="s3cret")
    try:
        for path in ("/metrics", "/api/runs", "/api/alerts"):
            assert get(f"{server.url}{path}")[0] == 401
            assert get(f"{server.url}{path}", token="wrong")[0] == 401
            assert get(f"{server.url}{path}", token="s3cret")[0] == 200
        assert get(f"{server.url}/healthz")[0] == 200
    finally:
        server.close()


def test_serving_beyond_loopback_without_a_token_is_refused(view: FakeView) -> None:
    with pytest.raises(HttpApiError, match="without a bearer token"):
        ApiServer(view, "0.0.0.0", 0)
    with pytest.raises(HttpApiError, match="all interfaces"):
        ApiServer(view, "", 0)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")


def test_a_taken_port_is_a_clear_error(view: FakeView, server: ApiServer) -> None:
    with pytest.raises(HttpApiError, match=f"cannot serve HTTP on 127.0.0.1:{server.port}"):
        ApiServer(view, "127.0.0.1", server.port)


def test_status_fetches_and_renders_the_running_daemon(view: FakeView) -> None:
    server = serve(view, token="t")
    try:
        runs, alerts = fetch_status(f"127.0.0.1:{server.port}", "t")
        with pytest.raises(StatusError, match="wants a bearer token"):
            fetch_status(f"127.0.0.1:{server.port}")
    finally:
        server.close()
    assert render_status(runs, alerts).splitlines() == [
        "RUN         STEP    AGE  FIRING",
        "exp1/seed0  1234    30s  critical grad_norm_growth (train/grad_norm)",
        "                         warning loss_nan (train/grad_norm)",
        "exp2/seed0    99  2h00m  -",
        "2 runs, 2 firing (1 critical, 1 warning)",
        "",
        "critical  exp1/seed0  grad_norm_growth: grad_norm_growth on exp1/seed0",
        "warning   exp1/seed0  loss_nan: loss_nan on exp1/seed0",
    ]


def test_on_a_narrow_terminal_status_wraps_messages_instead_of_cutting_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal_env(monkeypatch)
    runs, alerts = loaded(json.dumps(runs_document(SNAPSHOT, NOW)), alerts_document(SNAPSHOT, NOW))
    out = TtyBuffer()
    screen = console.console_for(out)
    screen.width = 60
    console.print_status(screen, runs, alerts)
    assert "\x1b[1;31mcritical" in out.getvalue() and "\x1b[33mwarning" in out.getvalue()
    lines = [x.rstrip() for x in plain(out.getvalue()).splitlines()]
    assert max(len(x) for x in lines) <= 60
    assert lines[1].split() == ["exp1/seed0", "1234", "30s", "critical", "grad_norm_growth"]
    words = " ".join(" ".join(lines).split())  # wrapped, nothing cut
    assert "critical exp1/seed0 grad_norm_growth: grad_norm_growth on exp1/seed0" in words


def test_a_daemon_with_nothing_to_show_renders_an_empty_table() -> None:
    text = render_status({"runs": []}, {"alerts": []})
    assert text == "RUN  STEP  AGE  FIRING\n0 runs, 0 firing\n"


def test_ages_are_precise_when_fresh_and_coarse_when_old() -> None:
    ages = [None, 0.4, 59, 61, 3599, 3600 + 5 * 60, 86400 * 2 + 3600 * 4 + 5]
    assert [format_age(a) for a in ages] == ["-", "0s", "59s", "1m", "59m", "1h05m", "2d04h"]


def test_addresses_become_urls() -> None:
    assert base_url("127.0.0.1:9465") == "http://127.0.0.1:9465"
    assert base_url(":9100") == "http://127.0.0.1:9100"
    assert base_url("node7") == "http://node7:9465"
    assert base_url("[::1]:9465") == "http://[::1]:9465"
    assert base_url("https://ts.example.com/") == "https://ts.example.com"


def test_status_says_when_no_daemon_answers() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(
        StatusError, match=f"no trainsentry daemon answers at http://127.0.0.1:{port}"
    ):
        fetch_status(f"127.0.0.1:{port}", timeout=5)


def test_the_board_publishes_at_most_once_per_interval() -> None:
    now = [0.0]
    board = SnapshotBoard(min_interval=1.0, clock=lambda: now[0], idle_interval=1.0)
    made: list[int] = []

    def capture() -> DaemonSnapshot:
        made.append(1)
        return DaemonSnapshot(cycles=len(made))

    assert board.refresh(capture) and board.latest().cycles == 1
    now[0] = 0.5
    assert not board.refresh(capture) and len(made) == 1  # not even captured
    now[0] = 1.0
    assert board.refresh(capture) and board.latest().cycles == 2


def test_a_live_view_is_built_from_the_runtime_pieces() -> None:
    store = Store()
    store.extend(
        [
            Point("a", "loss", 1, NOW - 10, 1.0),
            Point("a", "lr", 3, NOW - 5, 0.1),
            Point("b", "loss", 7, NOW - 1, 2.0),
        ]
    )
    stats = Stats(points=3, skipped_records=1, files=2, cycles=5)
    snap = DaemonSnapshot.capture(
        stats,
        rules_loaded=4,
        firing=[SNAPSHOT.alerts[0]],
        runs=runs_of_store(store),
        now=NOW,
    )
    assert snap.runs == (RunStatus("a", 3, NOW - 5, 2), RunStatus("b", 7, NOW - 1, 1))
    assert (snap.points_read, snap.records_skipped, snap.files_followed) == (3, 1, 2)
    board = SnapshotBoard()
    board.publish(snap)
    live = LiveView(board, heartbeat_age=lambda: 2.0, limit=30.0)
    assert live.snapshot() is snap and live.heartbeat_age() == 2.0
    assert live.heartbeat_limit() == 30.0 and dict(live.notification_counts()) == {}


@pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")
def test_inotify_watches_are_counted_from_the_kernel(tmp_path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0
    try:
        before = inotify_watches()
        assert before is not None
        for name in ("a", "b", "c"):
            (tmp_path / name).mkdir()
            assert libc.inotify_add_watch(fd, os.fsencode(tmp_path / name), 0x2) >= 0
        assert inotify_watches() == before + 3
    finally:
        os.close(fd)


def test_a_live_view_with_a_real_heartbeat_serves_healthz() -> None:
    clock = [100.0]
    heartbeat = Heartbeat(clock=lambda: clock[0])
    board = SnapshotBoard()
    board.publish(SNAPSHOT)
    live = LiveView(board, heartbeat.age, health_limit(2.0), notifications=lambda: {"queued": 1})
    server = ApiServer(live, "127.0.0.1", 0, clock=lambda: NOW, poll_interval=0.02)
    with server:
        assert get(f"{server.url}/healthz")[0] == 200
        clock[0] += 11.0  # no beat for longer than the limit (10s)
        assert get(f"{server.url}/healthz")[0] == 503
        heartbeat.beat()
        assert get(f"{server.url}/healthz")[0] == 200
        assert strict_json(get(f"{server.url}/api/runs")[2])["runs"][0]["run"] == "exp1/seed0"


def test_the_board_publishes_unasked_only_every_idle_interval_and_at_once_when_asked() -> None:
    """A reader wakes the loop and waits for the snapshot it asked for."""
    now = [0.0]
    board = SnapshotBoard(min_interval=1.0, clock=lambda: now[0], idle_interval=10.0, wait=5.0)
    made: list[int] = []

    def capture() -> DaemonSnapshot:
        made.append(1)
        return DaemonSnapshot(cycles=len(made))

    assert board.refresh(capture)  # the first one
    now[0] = 5.0
    assert not board.refresh(capture)  # nobody asked: not even captured
    woken = threading.Event()
    board.on_ask = woken.set
    got: list[DaemonSnapshot] = []
    reader = threading.Thread(target=lambda: got.append(board.latest(fresh_within=1.0)))
    reader.start()
    assert woken.wait(5)  # the reader asked and woke the loop
    assert board.refresh(capture)  # the loop's next cycle publishes for it
    reader.join(5)
    assert got and got[0].cycles == 2
    now[0] = 5.5
    assert board.latest(fresh_within=1.0).cycles == 2  # fresh enough: no ask
    now[0] = 14.0
    assert not board.refresh(capture)
    now[0] = 15.0
    assert board.refresh(capture) and len(made) == 3  # idle_interval since the last


def test_a_reader_of_a_stuck_loop_gets_the_old_snapshot_after_its_wait() -> None:
    now = [0.0]
    board = SnapshotBoard(clock=lambda: now[0], wait=0.05)
    board.publish(DaemonSnapshot(cycles=7))
    now[0] = 60.0  # a minute without a cycle
    assert board.latest(fresh_within=1.0).cycles == 7


def rank_status(rank: int, step: int, *, state: str = "running", node: str = "gpu-a") -> RunStatus:
    return RunStatus(
        f"job/rank{rank}",
        step,
        NOW - 2,
        4,
        state,
        job="job",
        rank=rank,
        attempt=0,
        node=node,
        step_seconds=0.25,
        values={("data_wait", "log"): 0.01 * (rank + 1), ("loss", "probe"): 2.0},
        last_error="RuntimeError: boom" if rank == 1 else "",
    )


def test_a_jobs_ranks_are_shown_as_a_job(view: FakeView) -> None:
    ranks = tuple(rank_status(r, 100 + r) for r in range(3))
    view.snap = replace(
        SNAPSHOT, runs=(*SNAPSHOT.runs, *ranks, RunStatus("job", 100, NOW, 1, job="job"))
    )
    runs, alerts = served_documents(view)
    by_run = {r["run"]: r for r in runs["runs"]}
    assert by_run["job/rank1"]["rank"] == 1 and by_run["job/rank1"]["node"] == "gpu-a"
    assert by_run["job/rank1"]["last_error"] == "RuntimeError: boom"
    [job] = runs["jobs"]
    assert job["job"] == "job" and [r["rank"] for r in job["ranks"]] == [0, 1, 2]
    assert job["runs"] == ["job", "job/rank0", "job/rank1", "job/rank2"]
    lines = render_status(runs, alerts).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("job: job of 3 rank(s)"))
    assert lines[at + 1].startswith("job ")
    assert lines[at + 2].startswith("  job/rank0 (rank 0, gpu-a)")
    assert lines[at + 4].startswith("  job/rank2 (rank 2, gpu-a)")


def test_the_ranks_of_running_jobs_are_exported_for_the_fleet(view: FakeView) -> None:
    ranks = (rank_status(0, 100), rank_status(1, 90), rank_status(2, 80, state="crashed"))
    view.snap = replace(SNAPSHOT, runs=(*SNAPSHOT.runs, *ranks))
    server = serve(view)
    try:
        body = get(f"{server.url}/metrics")[2]
    finally:
        server.close()
    samples = {
        (s.name, s.labels.get("rank"), s.labels.get("series")): (s.value, s.labels)
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("trainsentry_rank")
    }
    value, labels = samples[("trainsentry_rank_step", "1", None)]
    assert value == 90
    assert labels == {
        "job": "job",
        "rank": "1",
        "node": "gpu-a",
        "attempt": "0",
        "run": "job/rank1",
    }
    assert samples[("trainsentry_rank_step_timestamp_seconds", "0", None)][0] == NOW - 2
    assert samples[("trainsentry_rank_step_duration_seconds", "0", None)][0] == 0.25
    value, labels = samples[("trainsentry_rank_value", "1", "data_wait")]
    assert value == 0.02 and labels["source"] == "log"
    assert samples[("trainsentry_rank_value", "1", "loss")][1]["source"] == "probe"
    error = samples[("trainsentry_rank_last_error_info", "1", None)][1]
    assert error["line"] == "RuntimeError: boom"
    assert ("trainsentry_rank_step", "2", None) not in samples  # crashed: no rank of a live job
    assert samples[("trainsentry_ranks_not_exported", None, None)][0] == 0
