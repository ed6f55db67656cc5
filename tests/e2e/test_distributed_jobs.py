"""Real torchrun jobs on the CPU beside real daemons: a job's ranks judged as one job.

Four jobs run at once, once for the whole module, and each test asserts one
thing of what the daemons, Prometheus and Alertmanager said:

- `faults` (4 ranks, the probe attached): rank 1 sleeps in its forward from
  step 100, which only the probe's per-rank `forward_time` shows; rank 3 is
  fed random labels from step 100, so its loss leaves the others';
- `logs` (two nodes of 3 ranks, no probe): global rank 4 sleeps in its data
  loading from step 100, which only the job's own per-rank `data_time` lines
  show. Each node's torchrun agent logs into its own root, watched by its own
  daemon (`node-a`, `node-b`), and a real Prometheus scraping both with
  deploy/prometheus/'s rules sends the straggler to a real Alertmanager;
- `hang` (4 ranks): rank 2 blocks before its forward at step 30; the others
  wait in the gradient all-reduce until the 10 s process-group timeout;
- `healthy` (4 ranks, the probe attached): nothing wrong.

Each job's probe writes into `<root>/<rendezvous id>/`, beside torchrun's
`<root>/<rendezvous id>_<random>/`: both are the job `<rendezvous id>`
(jobs/identity.py), so a job pages once however many of its runs fire.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.alert_log import alerts
from support.daemon_process import DaemonProcess
from support.http_get import get_json
from support.notify_endpoints import HttpReceiver
from support.paths import REPO
from support.ports import free_port
from support.waiting import wait_until

dist = pytest.importorskip("torch.distributed")
pytestmark = [
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()), reason="no gloo in this torch"
    ),
    pytest.mark.timeout(600),
]

SCRIPT = REPO / "tests" / "support" / "dist_train.py"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ONSET = 100  # the step the faults begin at
PACE = 0.05  # seconds each step is padded with: a step is ~0.06-0.1 s on 2 busy cores
SLOW = 0.04  # seconds a slow rank loses a step: ~half the job's step
STEPS = 950  # a minute and more past the onset (at ~0.1 s a step), whatever the load
UNTIL_TOLD = ("faults", "healthy")  # and `logs`: they stop once their alerts are in
SLOW_RANK = 4  # of `logs`: on whichever node the rendezvous gives it

JOBS: dict[str, list[str]] = {
    "faults": [
        "--probe", "--steps", str(STEPS), "--slow-rank", "1", "--slow-seconds", str(SLOW),
        "--slow-from", str(ONSET), "--slow-where", "forward",
        "--corrupt-rank", "3", "--corrupt-from", str(ONSET),
    ],
    "logs": [
        "--steps", str(STEPS), "--slow-rank", str(SLOW_RANK), "--slow-seconds", str(SLOW),
        "--slow-from", str(ONSET), "--slow-where", "data",
    ],
    "hang": ["--steps", "200", "--block-rank", "2", "--block-at", "30", "--pg-timeout", "10"],
    "healthy": ["--probe", "--steps", str(STEPS)],
    # 2 ranks under --max-restarts 5, rank 0 crashing right after each attempt's first save
    # (each attempt's gloo addresses apart: dist_train.init_process_group)
    "restarts": [
        "--steps", "400", "--checkpoint-every", "30", "--crash-after-checkpoint",
        "--pg-timeout", "20",
    ],
}  # fmt: skip


@dataclass
class Node:
    """A daemon standing for one node: its root, its HTTP address, its alert lines."""

    name: str
    root: Path
    address: str
    alert_log: Path
    daemon: DaemonProcess | None = None

    def start(self, tmp: Path, *notify: str) -> None:
        config = tmp / f"{self.name}.yaml"
        config.write_text(f"node: {self.name}\n")
        self.daemon = DaemonProcess(
            str(self.root), "--config", str(config), "--state-dir", str(tmp / self.name),
            "--http", self.address, "--history", "all", "--alerts-jsonl", str(self.alert_log),
            *notify, merge_stderr=True,
        )  # fmt: skip


@dataclass
class Fleet:
    root: Path
    alerts: list[dict[str, Any]]  # node-a's
    alerts_b: list[dict[str, Any]]  # node-b's
    pages: list[dict[str, Any]]  # the notifications node-a sent, in order
    runs: dict[str, Any]  # node-a's /api/runs while the healthy job ran
    metrics: str  # node-a's /metrics while the healthy job ran
    slow_node: str  # the node `logs`' slow rank ran on
    slow_local: int  # its local rank there
    onsets: dict[str, float] = field(default_factory=dict)  # job → wall time of its fault
    managed: list[dict[str, Any]] | None = None  # Alertmanager's alerts; None: not run

    def of(
        self, job: str, rule: str | None = None, *, node: str = "node-a"
    ) -> list[dict[str, Any]]:
        said = self.alerts if node == "node-a" else self.alerts_b
        return [
            a
            for a in said
            if a.get("job") == job and a["state"] == "firing" and rule in (None, a["rule"])
        ]


def torchrun(
    root: Path, job: str, args: list[str], *, nodes: int = 1, ranks: int = 4, port: int = 0
) -> subprocess.Popen[str]:
    restarts = ["--max-restarts", "5"] if job == "restarts" else []
    if job == "restarts":
        ranks, args = 2, [*args, "--checkpoint", str(root / "restarts.pt")]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), *restarts,
        "--nproc_per_node", str(ranks), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port or free_port()}", "--rdzv-id", job,
        "--log-dir", str(root), "--redirects", "3",
        str(SCRIPT), "--logdir", str(root / job), "--seconds-per-step", str(PACE), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # a session of its own: a kill at the end takes its workers too (a worker stuck in a
    # rendezvous outlives its agent otherwise)
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def onset(job: str, *roots: Path) -> float:
    """When the job's fault began: the wall time rank 0 logged the onset step at."""
    for out in (out for root in roots for out in root.glob(f"{job}_*/attempt_0/*/stdout.log")):
        for record in records(out):
            if record["rank"] == 0 and record["step"] == ONSET:
                return float(record["time"])
    raise AssertionError(f"{job} never reached step {ONSET}")


def prometheus(tmp: Path, targets: list[str], alertmanager: str) -> subprocess.Popen[str]:
    """deploy/prometheus.yml and its rules as shipped, but for the targets, a 1 s cadence and
    `for:` of 5 s (the rules' own `for` is promtool-tested in test_prometheus_rules.py)."""
    assert PROMETHEUS is not None
    deploy = REPO / "deploy"
    rules = re.sub(
        r"for: \d+m", "for: 5s", (deploy / "prometheus" / "trainsentry-rules.yml").read_text()
    )
    (tmp / "rules.yml").write_text(rules)
    config = yaml.safe_load((deploy / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(tmp / "rules.yml")]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    config["scrape_configs"][0]["static_configs"] = [{"targets": targets}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{free_port()}", "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def alertmanager(tmp: Path, address: str) -> subprocess.Popen[str]:
    assert ALERTMANAGER is not None
    return subprocess.Popen(
        [
            ALERTMANAGER, f"--config.file={REPO / 'deploy' / 'alertmanager.yml'}",
            f"--storage.path={tmp / 'am'}", f"--web.listen-address={address}",
            "--cluster.listen-address=", "--log.level=error",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def managed_alerts(address: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{address}/api/v2/alerts", timeout=5) as response:
            return list(json.loads(response.read()))
    except OSError:
        return []


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    a = Node("node-a", tmp / "jobs", f"127.0.0.1:{free_port()}", tmp / "a.jsonl")
    b = Node("node-b", tmp / "node-b", f"127.0.0.1:{free_port()}", tmp / "b.jsonl")
    for node in (a, b):
        node.root.mkdir()
    receiver = HttpReceiver()
    a.start(tmp, "--notify", f"json://{receiver.url}/hook", "--group-wait", "2s")
    b.start(tmp)
    side: list[subprocess.Popen[str]] = []
    am = f"127.0.0.1:{free_port()}"
    if PROMETHEUS is not None and ALERTMANAGER is not None:
        side = [alertmanager(tmp, am), prometheus(tmp, [a.address, b.address], am)]
    rendezvous = free_port()
    # the long jobs end, all at one step, once what is asserted of them has been seen
    stop = tmp / "stop"
    until = ["--stop-file", str(stop)]
    jobs = {
        name: torchrun(a.root, name, [*args, *until] if name in UNTIL_TOLD else args)
        for name, args in JOBS.items()
        if name != "logs"
    }
    for node in (a, b):
        jobs[f"logs@{node.name}"] = torchrun(
            node.root, "logs", [*JOBS["logs"], *until], nodes=2, ranks=3, port=rendezvous
        )
    try:
        assert a.daemon is not None and b.daemon is not None
        a.daemon.wait_for_text("trainsentry")
        seen: dict[str, Any] = {}

        def healthy_running() -> bool:  # its 4 ranks' torchrun logs and 4 probe files
            seen["runs"] = get_json(a.address, "/api/runs")
            ranks = [r for r in seen["runs"]["runs"] if r["job"] == "healthy" and "rank" in r]
            stepping = [r for r in ranks if r["state"] == "running" and r["last_step"] >= 50]
            return len(stepping) == 8

        wait_until(healthy_running, "the healthy job's 8 ranked runs, running", timeout=120)
        runs, metrics = seen["runs"], _text(a.address, "/metrics")

        def said(node: Node, job: str, rule: str) -> bool:
            return any(a.get("job") == job and a["rule"] == rule for a in alerts(node.alert_log))

        wait_until(lambda: said(a, "faults", "rank_straggler"), "faults' straggler", timeout=400)
        slow = next(
            (node, int(out.parent.name))
            for node in (a, b)
            for out in node.root.glob("logs_*/attempt_0/*/stdout.log")
            if records(out)[0]["rank"] == SLOW_RANK
        )
        wait_until(lambda: said(slow[0], "logs", "rank_straggler"), "logs' straggler", 120)
        managed = None
        if side:

            def straggling() -> bool:
                seen["managed"] = managed_alerts(am)
                names = {(x["labels"]["alertname"], x["labels"]["job"]) for x in seen["managed"]}
                return ("TrainsentryRankStraggling", "logs") in names

            wait_until(straggling, "the fleet's straggler at Alertmanager", timeout=120)
            managed = seen["managed"]
        wait_until(lambda: said(a, "faults", "rank_diverged"), "faults' diverged rank", 120)
        receiver.wait_for(lambda reqs: any(b"faults" in r.body for r in reqs), timeout=60)
        stop.touch()
        for name, proc in jobs.items():
            _, err = proc.communicate(timeout=400)
            failed = name in ("hang", "restarts")
            assert proc.returncode == (1 if failed else 0), f"{name}: {err[-3000:]}"
        wait_until(lambda: said(a, "hang", "rank_blocked_collective"), "the hang's page", 60)
        # the daemon reads a crash loop's last attempts after torchrun has given up
        wait_until(lambda: said(a, "restarts", "restart_storm"), "the restarts' storm", 120)
        receiver.wait_for(lambda reqs: any(b"hang_" in r.body for r in reqs), timeout=60)
        yield Fleet(
            a.root, alerts(a.alert_log), alerts(b.alert_log),
            [r.json() for r in receiver.requests], runs, metrics, slow[0].name, slow[1],
            {"faults": onset("faults", a.root), "logs": onset("logs", a.root, b.root)},
            managed,
        )  # fmt: skip
    finally:
        for proc in jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in side:
            proc.kill()
        for node in (a, b):
            if node.daemon is not None:
                node.daemon.stop()
        receiver.close()


def _text(address: str, path: str) -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        return str(resp.read().decode())


def test_a_rank_slow_in_its_forward_is_named_from_the_probes_timing(fleet: Fleet) -> None:
    [alert] = fleet.of("faults", "rank_straggler")
    assert alert["run"] == "faults/rank1" and alert["rank"] == 1
    assert alert["metric"] == "probe/forward_time"
    assert "of rank 1 is" in alert["message"] and "the other ranks' median" in alert["message"]
    assert alert["wall_time"] - fleet.onsets["faults"] < 120  # within 2 minutes


def test_a_rank_slow_to_load_is_named_from_the_jobs_own_lines(fleet: Fleet) -> None:
    """By the daemon of its node, from its 3 ranks there."""
    [alert] = fleet.of("logs", "rank_straggler", node=fleet.slow_node)
    assert alert["run"].endswith(f"/attempt_0/{fleet.slow_local}")
    assert alert["rank"] == fleet.slow_local and alert["metric"] == "data_time"
    assert alert["wall_time"] - fleet.onsets["logs"] < 120
    other = "node-b" if fleet.slow_node == "node-a" else "node-a"
    assert fleet.of("logs", "rank_straggler", node=other) == []


@pytest.mark.skipif(
    PROMETHEUS is None or ALERTMANAGER is None,
    reason="no prometheus or Alertmanager binary (apt-get install prometheus "
    "prometheus-alertmanager; .ci/run does)",
)
def test_prometheus_compares_the_ranks_of_both_nodes_and_alertmanager_gets_the_straggler(
    fleet: Fleet,
) -> None:
    assert fleet.managed is not None
    [straggler] = [
        x
        for x in fleet.managed
        if x["labels"]["alertname"] == "TrainsentryRankStraggling" and x["labels"]["job"] == "logs"
    ]
    labels = straggler["labels"]
    assert (labels["job"], labels["node"], labels["rank"]) == (
        "logs",
        fleet.slow_node,
        str(fleet.slow_local),
    )
    assert labels["severity"] == "warning"


def test_a_rank_fed_garbage_is_named_as_diverging(fleet: Fleet) -> None:
    diverged = fleet.of("faults", "rank_diverged")
    assert diverged and {a["rank"] for a in diverged} == {3}
    assert {a["metric"] for a in diverged} <= {"loss", "probe/loss"}  # its lines, its probe
    assert "ranks at this step" in diverged[0]["message"]


def test_a_hang_pages_the_rank_the_others_waited_for_with_their_timeout_lines(
    fleet: Fleet,
) -> None:
    [hang] = fleet.of("hang", "rank_blocked_collective")
    assert hang["rank"] == 2 and hang["severity"] == "critical"
    assert "rank 2 of hang did not join a collective: ranks 0, 1 and 3 timed out" in hang["message"]
    assert "gloo/transport/tcp/" in hang["message"]  # the first waiting rank's own line
    lines = [a["message"] for a in fleet.of("hang", "gloo_collective_timeout")]
    # each waiting rank's line: its timeout, or a peer gone when that peer timed out first
    assert any("Timed out waiting 10000ms for" in line for line in lines)
    pages = [p for p in fleet.pages if "hang" in json.dumps(p)]
    assert "rank_blocked_collective" in pages[0]["title"]  # the page names it, not a victim
    assert "did not join a collective" in pages[0]["message"]
    waited = {a["rank"] for a in fleet.of("hang", "gloo_collective_timeout")}
    assert waited == {0, 1, 3}


def test_one_page_per_job_however_many_ranks_fire(fleet: Fleet) -> None:
    """Rank 3's garbage pages `faults` (its loss leaps x15 at once: a spike, then a
    divergence that every rank's loss follows), the blocked rank `hang`: each once, every
    later alert of any of its runs (its probe's too) an update of that page."""
    for job in ("faults", "hang"):
        told = [p["title"] for p in fleet.pages if p["title"].split()[1].startswith(job)]
        assert told, f"{job} was never told"
        assert sum("update to the incident" not in title for title in told) == 1, told


def test_a_healthy_job_says_nothing(fleet: Fleet) -> None:
    # but of its pace, which is the test box's: four jobs' processes share its cores,
    # and a job they slow ×3 for a second is told so (throughput_drop), rightly
    assert [a for a in fleet.of("healthy") if a.get("family") != "pace"] == []


def test_the_api_shows_each_job_with_its_ranks(fleet: Fleet) -> None:
    jobs = {j["job"]: j for j in fleet.runs["jobs"]}
    ranks = {(r["rank"], r["run"].startswith("healthy/")) for r in jobs["healthy"]["ranks"]}
    assert ranks == {(r, probe) for r in range(4) for probe in (True, False)}


def test_metrics_export_every_rank_of_the_running_jobs(fleet: Fleet) -> None:
    steps = [
        line for line in fleet.metrics.splitlines() if line.startswith("trainsentry_rank_step{")
    ]
    healthy = [line for line in steps if 'job="healthy"' in line]
    assert len(healthy) == 8  # 4 ranks, each a torchrun run and a probe run
    assert any('series="forward_time"' in line for line in fleet.metrics.splitlines())


def test_a_crash_loop_under_torchrun_restarts_is_a_storm_with_what_each_restart_lost(
    fleet: Fleet,
) -> None:
    """torchrun restarts the job 5 times; each attempt resumes from the checkpoint the one
    before saved and crashes after its own first save. (An attempt that dies in its
    rendezvous, logging no step, is a restart all the same: test_attempts.py.)"""
    said = fleet.of("restarts", "job_restarted")
    restarted = [a["message"] for a in said]
    assert restarted and all(a["severity"] == "warning" for a in said)
    resumed = next(m for m in restarted if "resumed at step" in m)
    assert "resumed at step 30; the attempt before got to step 29" in resumed
    assert "steps and" in resumed and "of work lost" in resumed
    # how the attempt before ended: rank 0's injected crash (not rank 1's collective that
    # lost it), or the rendezvous that failed
    assert "and ended: RuntimeError: " in resumed
    for died in (m for m in restarted if "resumed at step" not in m):
        assert "ended before its first step: RuntimeError: " in died
    assert len({a["run"].split("/attempt_")[1].split("/")[0] for a in said}) == len(said)
    crashes = [a["message"] for a in fleet.of("restarts", "python_exception")]
    assert any("injected crash after the checkpoint of step 29" in m for m in crashes)
    [storm] = fleet.of("restarts", "restart_storm")
    assert storm["severity"] == "critical" and "restarts in 30 min" in storm["message"]
    assert int(storm["run"].split("/attempt_")[1].split("/")[0]) >= 3  # its third restart on
    assert fleet.of("restarts", "restarts_no_progress") == []  # each attempt saved further on
