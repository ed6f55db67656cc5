"""Jobs that die, through the real daemon: real crashes in real text logs, paged with their words.

Each job is a real process writing its stdout and stderr to a file in its run
directory, as Slurm and torchrun do: a torch job whose matrix product fails
(a real RuntimeError, chained under the error it handles), a DataLoader whose
worker is SIGKILLed, a checkpoint saved to /dev/full (a real ENOSPC from torch.save),
and a child SIGKILLed under a shell (the shell's own `Killed`). The daemon
must page each as what it is, quote the exception line with the log's path and
line, mask the secrets the job printed, and end the run's metric alerts with
"run crashed: <cause>", not leave them to "went quiet".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.alert_log import alerts, find, status_of
from support.daemon_process import DaemonProcess
from support.notify_endpoints import HttpReceiver
from support.ports import free_port
from support.waiting import wait_until

PASSWORD = "hunter2-pa55"
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWx"

CRASHING_JOB = f"""
import json, sys, torch
metrics = open(sys.argv[1], "a")
model = torch.nn.Linear(16, 4)
for step in range(6):
    loss = float("nan") if step == 5 else 1.0 / (step + 1)
    metrics.write(json.dumps({{"step": step, "loss": loss}}) + "\\n")
    metrics.flush()
print("epoch 0 done", flush=True)
try:
    model(torch.randn(8, 12))
except RuntimeError as exc:
    raise RuntimeError(
        "resume from https://bob:{PASSWORD}@hub.example/ckpt failed (token {TOKEN})"
    ) from exc
"""

# The worker dies of SIGKILL as it starts, before any batch is in flight: torch then
# reports it the same way every time (a batch being sent would surface as an EOFError).
DATALOADER_JOB = """
import os, signal
from torch.utils.data import DataLoader
def die(worker_id):
    os.kill(os.getpid(), signal.SIGKILL)
for batch in DataLoader(range(64), num_workers=1, batch_size=2, worker_init_fn=die): pass
"""

SAVE_JOB = """
import torch
torch.save({"w": torch.zeros(1000)}, "/dev/full")
"""


def job(script: str, run: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run `script` as a job whose stdout and stderr land in run/stdout.log."""
    with (run / "stdout.log").open("ab") as out:
        return subprocess.run([sys.executable, "-c", script, *args], stdout=out, stderr=out)


def new_run(tmp_path: Path) -> tuple[Path, Path, str]:
    """A run directory whose job has started its log, the alert log's path, an HTTP address."""
    run = tmp_path / "logs" / "exp1"
    run.mkdir(parents=True)
    (run / "stdout.log").write_text("starting\n")
    return run, tmp_path / "alerts.jsonl", f"127.0.0.1:{free_port()}"


def test_a_crashing_torch_job_is_paged_with_its_exception_line_and_its_secrets_masked(
    tmp_path: Path,
) -> None:
    run, out, address = new_run(tmp_path)
    receiver = HttpReceiver()
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", address,
        "--alerts-jsonl", str(out), "--notify", f"json://{receiver.url}/hook",
        merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        ended = job(CRASHING_JOB, run, str(run / "metrics.jsonl"))
        assert ended.returncode == 1
        wait_until(lambda: find(out, rule="python_exception", state="firing"), "the crash paged")
        wait_until(
            lambda: find(out, rule="loss_non_finite", state="resolved"), "the NaN alert resolved"
        )
        assert receiver.wait_for(
            lambda reqs: any("python_exception" in r.body.decode() for r in reqs)
        )
        status = status_of(address)
    finally:
        daemon.stop()
        receiver.close()
    crash = find(out, rule="python_exception", state="firing")
    assert crash is not None
    assert crash["message"].startswith(
        "RuntimeError: resume from https://bob:****@hub.example/ckpt failed (token hf_****)"
    )
    assert (
        "while handling: RuntimeError: mat1 and mat2 shapes cannot be multiplied"
        in (crash["message"])
    )
    assert crash["log"]["path"] == str(run / "stdout.log")
    lines = (run / "stdout.log").read_text().splitlines()
    assert lines[crash["log"]["line"] - 1] == "Traceback (most recent call last):"
    nan = find(out, rule="loss_non_finite", state="resolved")
    assert nan is not None and nan["reason"].startswith("run crashed: RuntimeError: resume from")
    assert "exp1 (crashed: RuntimeError: resume from https://bob:****@hub.example" in status
    told = "".join(r.body.decode() for r in receiver.requests)
    assert "mat1 and mat2 shapes cannot be multiplied" in told
    # the incident bundles carry the job's own last lines, masked, and the run's life
    incidents = tmp_path / "state" / "incidents" / "exp1"
    [bundle_path] = incidents.glob("python_exception-*.json")
    bundle = json.loads(bundle_path.read_text())
    logged = [x["text"] for x in bundle["logs"]]
    assert "epoch 0 done" in logged and "Traceback (most recent call last):" in logged
    assert bundle["run"]["life"]["state"] == "crashed"
    [nan_bundle] = incidents.glob("loss_non_finite-*.json")
    assert "starting" in [x["text"] for x in json.loads(nan_bundle.read_text())["logs"]]
    bundles = "".join(p.read_text() for p in incidents.glob("*.json"))
    everything = out.read_text() + told + "".join(daemon.lines) + bundles + status
    assert PASSWORD not in everything and TOKEN not in everything


def test_a_dead_dataloader_worker_a_full_disk_and_a_killed_child_are_each_paged_as_what_they_are(
    tmp_path: Path,
) -> None:
    root = tmp_path / "logs"
    runs = {name: root / name for name in ("loader", "save", "killed")}
    for run in runs.values():
        run.mkdir(parents=True)
        (run / "stdout.log").write_text("starting\n")
    out = tmp_path / "alerts.jsonl"
    daemon = DaemonProcess(
        str(root), "--state-dir", str(tmp_path / "state"), "--http", "off",
        "--alerts-jsonl", str(out), merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        assert job(DATALOADER_JOB, runs["loader"]).returncode == 1
        assert job(SAVE_JOB, runs["save"]).returncode == 1
        with (runs["killed"] / "stdout.log").open("ab") as log:
            child = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
            subprocess.run(["bash", "-c", f"{sys.executable} -c '{child}'; true"], stderr=log)
        for run, rule in (
            ("loader", "dataloader_worker_died"),
            ("save", "disk_full"),
            ("killed", "process_killed"),
        ):
            wait_until(lambda: find(out, run=run, rule=rule), f"{rule} paged for {run}")  # noqa: B023
    finally:
        daemon.stop()
    loader = find(out, run="loader", rule="dataloader_worker_died")
    assert loader is not None
    assert "DataLoader worker (pid " in loader["message"]
    assert "is killed by signal: Killed." in loader["message"]
    save = find(out, run="save", rule="disk_full")
    assert save is not None and "unexpected pos" in save["message"]
    killed = find(out, run="killed", rule="process_killed")
    assert killed is not None and " Killed " in killed["message"]


def test_a_crash_stays_a_crash_across_a_daemon_restart_and_is_not_paged_twice(
    tmp_path: Path,
) -> None:
    run, out, address = new_run(tmp_path)
    args = (
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", address,
        "--alerts-jsonl", str(out),
    )  # fmt: skip
    first = DaemonProcess(*args, merge_stderr=True)
    try:
        first.wait_for_text("caught up")
        assert job("import torch\ntorch.ones(2) @ torch.ones(3)\n", run).returncode == 1
        wait_until(lambda: find(out, rule="python_exception", state="firing"), "the crash paged")
    finally:
        first.stop()  # a clean stop saves the alert state
    second = DaemonProcess(*args, merge_stderr=True)
    try:
        second.wait_for_text("caught up")
        status = status_of(address)
    finally:
        second.stop()
    assert "exp1 (crashed: RuntimeError: inconsistent tensor size" in status
    assert "python_exception" in status
    assert [a["state"] for a in alerts(out) if a["rule"] == "python_exception"] == ["firing"]
