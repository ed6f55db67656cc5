"""Checkpoints of real HF and Lightning jobs, read as a series by the real daemon and replay.

One daemon watches a root while HF Trainer jobs write into it: one whose saves
stop while it trains on (warned overdue), one that checkpoints every few steps
and resumes once from its last checkpoint (nothing paged), and a checkpoint
folder a save left without its last file (warned partial). Each is replayed
too, and says the same. A Lightning job with ModelCheckpoint is killed with
SIGKILL after its last save: its crash's page says the steps lost since.

The pack waits at least 2 minutes before a checkpoint is overdue (the lag of
telling one whose files are settling, a second for HF's); these jobs save every
fraction of a second, so a rule file shortens that to 3 seconds, still well
over the lag. Jobs pace their steps so that wall time, like steps, says how far
past a checkpoint they are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from support.alert_log import alerts, find
from support.daemon_process import DaemonProcess, replayed_alerts
from support.paths import SUPPORT
from support.ports import free_port
from support.waiting import wait_until

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("lightning")

from support.checkpoint_jobs import hf_train

from trainsentry import cli
from trainsentry.sources import checkpoints as source

FAST = """
rules:
  - name: checkpoint_overdue
    severity: warning
    family: checkpoints
    checkpoints: {overdue: 3, min_late: 3s}
  - name: checkpoint_work_lost
    severity: critical
    family: checkpoints
    checkpoints: {overdue: 3, min_late: 3s, lost: true}
"""
JOB = SUPPORT / "checkpoint_jobs.py"
SAVES = ("checkpoint_overdue", "checkpoint_work_lost", "checkpoint_partial")


@dataclass
class Live:
    root: Path
    rules: Path
    alerts: Path
    address: str

    def runs(self) -> dict[str, dict[str, Any]]:
        with urlopen(f"http://{self.address}/api/runs", timeout=10) as answer:
            return {r["run"]: r for r in json.load(answer)["runs"]}

    def saves(self, run: str) -> list[dict[str, Any]]:
        return [a for a in alerts(self.alerts) if a["run"] == run and a["rule"] in SAVES]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    base = tmp_path_factory.mktemp("checkpoints")
    (base / "logs").mkdir()
    (base / "fast.yaml").write_text(FAST)
    found = Live(
        base / "logs", base / "fast.yaml", base / "alerts.jsonl", f"127.0.0.1:{free_port()}"
    )
    daemon = DaemonProcess(
        str(found.root), "--state-dir", str(base / "state"), "--http", found.address,
        "--rules", "default", str(found.rules), "--alerts-jsonl", str(found.alerts),
        merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        yield found
    finally:
        daemon.stop()


def replayed(path: Path, rules: Path) -> list[dict[str, Any]]:
    return replayed_alerts(str(path), "--rules", "default", str(rules))


def test_an_hf_job_whose_saves_stop_while_it_trains_on_is_warned_overdue(live: Live) -> None:
    out = live.root / "hf"
    hf_train(out, max_steps=60, save_every=5, stop_saving_after=15, pace=0.1)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-10", "checkpoint-15", "checkpoint-5",
    ]  # fmt: skip
    wait_until(lambda: find(live.alerts, run="hf", rule="checkpoint_overdue"), "overdue told")
    told = find(live.alerts, run="hf", rule="checkpoint_overdue")
    assert told is not None and told["severity"] == "warning"
    assert told["labels"]["checkpoint_step"] == "15"
    assert "hf: no checkpoint since step 15 while the job went on to step" in told["message"]
    assert "(it checkpointed every 5 steps" in told["message"]
    assert told["job"] == "hf"
    # the replay of the finished job says what the daemon said as it went
    again = [a for a in replayed(out, live.rules) if a["rule"] in SAVES]
    assert [(a["rule"], a["run"], a["labels"]["checkpoint_step"]) for a in again] == [
        ("checkpoint_overdue", "hf", "15")
    ]


def test_an_hf_job_that_checkpoints_and_resumes_once_pages_nothing(live: Live) -> None:
    out = live.root / "resumed"
    hf_train(out, max_steps=20, save_every=5, pace=0.01)
    hf_train(out, max_steps=40, save_every=5, pace=0.01, resume=True)  # a planned restart
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert steps == [5, 10, 15, 20, 25, 30, 35, 40]

    def read_to_the_end() -> bool:
        runs = live.runs()
        logged = [r for name, r in runs.items() if name.startswith("resumed/runs/")]
        return runs.get("resumed", {}).get("last_step") == 40 and any(
            r["last_step"] == 40 for r in logged
        )

    wait_until(read_to_the_end, "the daemon read every checkpoint and record of the job")
    assert live.saves("resumed") == []
    assert [
        a
        for a in alerts(live.alerts)
        if a["run"].startswith("resumed") and a["severity"] == "critical"
    ] == []
    assert [
        a for a in replayed(out, live.rules) if a["rule"] in SAVES or a["severity"] == "critical"
    ] == []


def test_a_checkpoint_folder_left_without_its_last_file_is_warned_partial(
    live: Live, tmp_path: Path
) -> None:
    staging = tmp_path / "partial"
    hf_train(staging, max_steps=20, save_every=10)
    # what a save killed before its last file leaves: checkpoint-30 without trainer_state.json
    left = staging / "checkpoint-30"
    shutil.copytree(staging / "checkpoint-20", left)
    (left / "trainer_state.json").unlink()
    old = time.time() - 2 * source.PARTIAL_SECONDS  # nothing written to it since
    for path in [*left.rglob("*"), left]:
        os.utime(path, (old, old))
    shutil.move(str(staging), str(live.root / "partial"))
    wait_until(lambda: find(live.alerts, run="partial", rule="checkpoint_partial"), "partial told")
    told = find(live.alerts, run="partial", rule="checkpoint_partial")
    assert told is not None and told["step"] == 30 and told["severity"] == "warning"
    assert (
        "checkpoint/partial at step 30 says the checkpoint of that step was never completed"
        in (told["message"])
    )
    again = [(a["rule"], a["step"]) for a in replayed(live.root / "partial", live.rules)]
    assert ("checkpoint_partial", 30) in again


def test_a_lightning_job_killed_after_its_last_checkpoint_pages_the_steps_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    with (job / "train.log").open("w") as log:  # the job's shell: its stdout, stderr, and "Killed"
        ran = subprocess.run(
            ["bash", "-c", f'"{sys.executable}" "{JOB}" "{job}" 45; exit $?'],
            stdout=log, stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip
    assert ran.returncode == 128 + 9, (job / "train.log").read_text()[-2000:]
    saved = sorted(p.name for p in (job / "checkpoints").glob("*.ckpt"))
    assert saved == [f"epoch=0-step={s}.ckpt" for s in (10, 20, 30, 40)]
    # The last checkpoint was written a moment before the kill; a real job's are minutes
    # apart and long settled by the time anyone replays it: settle as fast here.
    monkeypatch.setattr(source, "SETTLE_SECONDS", 0.1)
    assert cli.main(["replay", str(job), "--format", "jsonl"]) == 0
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    crash = next(a for a in said if a["rule"] == "process_killed" and a["state"] == "firing")
    assert crash["run"] == "job" and crash["severity"] == "critical"
    assert "since the last checkpoint (step 40)" in crash["message"], crash["message"]
    lost = int(crash["message"].split("; ")[-1].split(" steps")[0])
    assert 3 <= lost <= 5, crash["message"]  # Lightning logs a batch's step before it steps
    assert not [a for a in said if a["rule"] == "checkpoint_work_lost"]  # not overdue: no such page
    checkpoints = [a for a in said if a["rule"] in SAVES]
    assert checkpoints == []
