"""Real torchrun jobs on the CPU beside the real daemon: a job's ranks judged as one job.

Four jobs of 4 gloo ranks each (tests/support/dist_train.py) run at once under
one daemon, once for the whole module, and each test asserts one thing of
what the daemon said:

- `faults` (the probe attached): rank 1 sleeps in its forward from step 100,
  which only the probe's per-rank `forward_time` shows; rank 3 is fed random
  labels from step 100, so its loss leaves the others';
- `logs` (no probe): rank 2 sleeps in its data loading from step 100, which
  the job's own per-rank `data_time` lines show;
- `hang`: rank 2 blocks before its forward at step 30; the others wait in the
  gradient all-reduce until the 10 s process-group timeout;
- `healthy` (the probe attached): nothing wrong.

Each job's probe writes into `<root>/<rendezvous id>/`, beside torchrun's
`<root>/<rendezvous id>_<random>/`: both are the job `<rendezvous id>`
(jobs/identity.py), so a job pages once however many of its runs fire.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.alert_log import alerts
from support.daemon_process import DaemonProcess
from support.http_get import get_json
from support.notify_endpoints import HttpReceiver
from support.ports import free_port
from support.waiting import wait_until

dist = pytest.importorskip("torch.distributed")
pytestmark = [
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()), reason="no gloo in this torch"
    ),
    pytest.mark.timeout(600),
]

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "dist_train.py"
ONSET = 100  # the step the faults begin at
PACE = 0.05  # seconds each step is padded with: a step is ~0.06-0.1 s on 2 busy cores
SLOW = 0.04  # seconds a slow rank loses a step: ~half the job's step
STEPS = 1000  # a minute and more past the onset, whatever the machine's load

JOBS: dict[str, list[str]] = {
    "faults": [
        "--probe", "--steps", str(STEPS), "--slow-rank", "1", "--slow-seconds", str(SLOW),
        "--slow-from", str(ONSET), "--slow-where", "forward",
        "--corrupt-rank", "3", "--corrupt-from", str(ONSET),
    ],
    "logs": [
        "--steps", str(STEPS), "--slow-rank", "2", "--slow-seconds", str(SLOW),
        "--slow-from", str(ONSET), "--slow-where", "data",
    ],
    "hang": ["--steps", "200", "--block-rank", "2", "--block-at", "30", "--pg-timeout", "10"],
    "healthy": ["--probe", "--steps", str(STEPS)],
}  # fmt: skip


@dataclass
class Fleet:
    root: Path
    alerts: list[dict[str, Any]]
    pages: list[dict[str, Any]]  # the notifications the receiver got, in order
    runs: dict[str, Any]  # /api/runs while the jobs ran
    metrics: str  # /metrics while the jobs ran
    onsets: dict[str, float] = field(default_factory=dict)  # job → wall time of its fault

    def of(self, job: str, rule: str | None = None) -> list[dict[str, Any]]:
        return [
            a
            for a in self.alerts
            if a.get("job") == job and a["state"] == "firing" and rule in (None, a["rule"])
        ]


def torchrun(root: Path, job: str, args: list[str]) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "4",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--rdzv-id", job, "--log-dir", str(root), "--redirects", "3",
        str(SCRIPT), "--logdir", str(root / job), "--seconds-per-step", str(PACE), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def onset(root: Path, job: str) -> float:
    """When the job's fault began: the wall time rank 0 logged the onset step at."""
    [out] = root.glob(f"{job}_*/attempt_0/0/stdout.log")
    for line in out.read_text().splitlines():
        record = json.loads(line)
        if record["step"] == ONSET:
            return float(record["time"])
    raise AssertionError(f"{job} never reached step {ONSET}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    root = tmp / "jobs"
    root.mkdir()
    receiver = HttpReceiver()
    address = f"127.0.0.1:{free_port()}"
    alert_log = tmp / "alerts.jsonl"
    daemon = DaemonProcess(
        str(root), "--state-dir", str(tmp / "state"), "--http", address,
        "--history", "all", "--alerts-jsonl", str(alert_log),
        "--notify", f"json://{receiver.url}/hook", "--group-wait", "2s",
        merge_stderr=True,
    )  # fmt: skip
    jobs = {name: torchrun(root, name, args) for name, args in JOBS.items()}
    try:
        daemon.wait_for_text("trainsentry")

        def said(job: str, rule: str) -> bool:
            return any(a.get("job") == job and a["rule"] == rule for a in alerts(alert_log))

        wait_until(lambda: said("faults", "rank_straggler"), "faults' straggler", timeout=400)
        runs, metrics = get_json(address, "/api/runs"), _text(address, "/metrics")
        for name, proc in jobs.items():
            _, err = proc.communicate(timeout=400)
            assert proc.returncode == (1 if name == "hang" else 0), f"{name}: {err[-3000:]}"
        wait_until(lambda: said("hang", "rank_blocked_collective"), "the hang's page", 60)
        receiver.wait_for(lambda reqs: any("hang" in r.body.decode() for r in reqs), timeout=60)
        yield Fleet(
            root, alerts(alert_log), [r.json() for r in receiver.requests], runs, metrics,
            {job: onset(root, job) for job in ("faults", "logs")},
        )  # fmt: skip
    finally:
        for proc in jobs.values():
            proc.kill()
        daemon.stop()
        receiver.close()


def _text(address: str, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        return str(resp.read().decode())


def test_a_rank_slow_in_its_forward_is_named_from_the_probes_timing(fleet: Fleet) -> None:
    [alert] = fleet.of("faults", "rank_straggler")
    assert alert["run"] == "faults/rank1" and alert["rank"] == 1
    assert alert["metric"] == "probe/forward_time"
    assert "of rank 1 is" in alert["message"] and "the other ranks' median" in alert["message"]
    assert alert["wall_time"] - fleet.onsets["faults"] < 120  # within 2 minutes


def test_a_rank_slow_to_load_is_named_from_the_jobs_own_lines(fleet: Fleet) -> None:
    [alert] = fleet.of("logs", "rank_straggler")
    assert alert["run"].endswith("/attempt_0/2") and alert["rank"] == 2
    assert alert["metric"] == "data_time"
    assert alert["wall_time"] - fleet.onsets["logs"] < 120


def test_a_rank_fed_garbage_is_named_as_diverging(fleet: Fleet) -> None:
    diverged = fleet.of("faults", "rank_diverged")
    assert diverged and {a["rank"] for a in diverged} == {3}
    assert all(a["metric"] == "loss" for a in diverged)
    assert "ranks at this step" in diverged[0]["message"]


def test_a_hang_pages_the_rank_the_others_waited_for_with_their_timeout_lines(
    fleet: Fleet,
) -> None:
    [hang] = fleet.of("hang", "rank_blocked_collective")
    assert hang["rank"] == 2 and hang["severity"] == "critical"
    assert "rank 2 of hang did not join a collective: ranks 0, 1 and 3 timed out" in hang["message"]
    assert "Timed out waiting 10000ms for" in hang["message"]
    pages = [p for p in fleet.pages if "hang" in json.dumps(p)]
    assert "rank_blocked_collective" in pages[0]["title"]  # the page names it, not a victim
    assert "Timed out waiting 10000ms" in pages[0]["body"]
    waited = {a["rank"] for a in fleet.of("hang", "gloo_collective_timeout")}
    assert waited == {0, 1, 3}


def test_one_page_per_job_however_many_ranks_fire(fleet: Fleet) -> None:
    for job in ("faults", "logs", "hang"):
        told = [p for p in fleet.pages if f"{job}" in p["title"]]
        assert told, f"{job} was never told"
        assert sum("joins the incident" not in p["body"] for p in told) == 1, told


def test_a_healthy_job_says_nothing(fleet: Fleet) -> None:
    assert fleet.of("healthy") == []


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
