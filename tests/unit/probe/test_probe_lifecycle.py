"""How the probe follows a loop and stays out of its way, on real CPU loops:
step boundaries (accumulation, validation, no optimizer), failure, stop files,
options, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import Net, batches, read

import trainsentry_probe
from trainsentry_probe import TrainingStopped, gradients
from trainsentry_probe.gpu import NvmlSampler


def test_gradient_accumulation_counts_optimizer_steps_and_averages_the_loss(
    tmp_path: Path,
) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    given = []
    with trainsentry_probe.watch(model, opt, tmp_path) as probe:
        for i, (x, y) in enumerate(batches(6)):
            loss = F.cross_entropy(model(x), y)
            (loss / 3).backward()
            probe.record(loss=loss)  # before the step: belongs to the step in progress
            given.append(float(loss.detach()))
            if i % 3 == 2:
                opt.step()
                opt.zero_grad()
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["probe/loss"] == pytest.approx(sum(given[:3]) / 3, rel=1e-6)
    assert records[1]["probe/loss"] == pytest.approx(sum(given[3:]) / 3, rel=1e-6)


def test_validation_passes_do_not_count_as_training_steps(tmp_path: Path) -> None:
    class WithLoss(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # returns its loss, as HF models
            return super().forward(x).pow(2).mean()

    model = WithLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train, val = [], []
    with trainsentry_probe.watch(model, opt, tmp_path) as probe:
        for x, _ in batches(3):
            train_loss = model(x)
            train_loss.backward()
            opt.step()
            opt.zero_grad()
            train.append(float(train_loss.detach()))
            model.eval()
            with torch.no_grad():
                val.append(float(model(x + 1)))
            model.train()
            probe.record(val_loss=val[-1])
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["probe/loss"] for r in records] == pytest.approx(train, rel=1e-6)
    assert [r["probe/val_loss"] for r in records] == pytest.approx(val, rel=1e-6)


def test_without_an_optimizer_record_marks_each_step(tmp_path: Path) -> None:
    model = Net()
    with trainsentry_probe.watch(model, None, tmp_path, layer_every=2) as probe:
        for step, (x, y) in enumerate(batches(4), start=100):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            probe.record(step, loss=loss)
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [100, 101, 102, 103]
    assert all(r["probe/grad_norm"] > 0 for r in records)
    assert "probe/grad_norm/fc1" in records[0] and "probe/grad_norm/fc1" not in records[1]


def test_an_internal_failure_disables_the_probe_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(gradients, "gradient_step", broken)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path)
    for x, y in batches(3):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss=1.0)
    probe.close()
    assert isinstance(probe.failed, RuntimeError) and "disabled" in caplog.text
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks


def test_should_stop_honours_a_stop_file_and_can_raise(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path, stop_every=3)
    assert not probe.should_stop()  # call 1 looks: nothing there
    stop = tmp_path / ".trainsentry" / "STOP"
    stop.parent.mkdir()
    stop.write_text(
        json.dumps({"rule": "layer_grad_norm_non_finite", "step": 41, "reason": "fc2 is NaN"})
    )
    assert [probe.should_stop() for _ in range(3)] == [False, False, True]  # one stat per 3
    with pytest.raises(TrainingStopped, match=r"layer_grad_norm_non_finite.*step 41.*fc2 is NaN"):
        probe.should_stop(raise_error=True)
    assert probe.stop_request is not None and probe.stop_request.step == 41
    probe.close()


def test_a_stop_file_older_than_the_run_is_ignored(tmp_path: Path) -> None:
    stop = tmp_path / "control" / "STOP"
    stop.parent.mkdir()
    stop.write_text("stop")
    old = time.time() - 3600
    os.utime(stop, (old, old))
    probe = trainsentry_probe.watch(
        Net(), None, tmp_path, control_dir=str(stop.parent), stop_every=1
    )
    assert not probe.should_stop()
    stop.write_text("not valid json, still a stop")  # rewritten now: a fresh request
    with pytest.raises(TrainingStopped, match="not valid json"):
        probe.should_stop(raise_error=True)
    probe.close()


def test_the_daemons_stop_file_is_understood(tmp_path: Path) -> None:
    stop_file = pytest.importorskip("trainsentry.actions.stop_file")
    path = stop_file.stop_file_path("runs/a", tmp_path, None)
    probe = trainsentry_probe.watch(Net(), None, tmp_path, stop_every=1)
    alert = pytest.importorskip("trainsentry.alert")
    why = alert.Transition("runs/a", "r", "critical", "firing", 9, 0.0, "loss", 1.0, "why")
    stop_file.write_stop_file(path, why)
    assert probe.should_stop()
    assert probe.stop_request is not None
    assert (probe.stop_request.rule, probe.stop_request.step, probe.stop_request.reason) == (
        "r",
        9,
        "why",
    )
    probe.close()


PLAIN_LOOP = """
import json, os, sys
sys.modules["torch"] = None  # as where torch is not installed: importing it fails
from trainsentry.actions.stop_file import write_stop_file
from trainsentry.alert import Transition
import trainsentry_probe

logdir, past_runs = sys.argv[1], float(sys.argv[2])
stop = trainsentry_probe.StopFile(logdir)
assert os.path.exists(stop.path) and os.stat(stop.path).st_mtime == past_runs
seen = [stop.requested() for _ in range(3)]  # the loop's first steps
nan = Transition("run", "r", "critical", "firing", 7, 0.0, "loss", float("nan"), "loss is NaN")
write_stop_file(stop.path, nan)  # the daemon
seen += [stop.requested() for _ in range(2)]
print(json.dumps([None if s is None else [s.rule, s.step, s.reason] for s in seen]))
"""


def test_a_plain_loop_without_torch_ignores_a_past_runs_stop_file_and_sees_a_new_one(
    tmp_path: Path,
) -> None:
    stop_file = pytest.importorskip("trainsentry.actions.stop_file")
    alert = pytest.importorskip("trainsentry.alert")
    old = alert.Transition("run", "old", "critical", "firing", 3, 0.0, "loss", 1.0, "old")
    past = stop_file.write_stop_file(stop_file.stop_file_path("run", tmp_path, None), old)
    an_hour_ago = float(int(time.time()) - 3600)
    os.utime(past, (an_hour_ago, an_hour_ago))
    env = {k: v for k, v in os.environ.items() if k != "TRAINSENTRY_STOP_FILE"}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_LOOP, str(tmp_path), str(an_hour_ago)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    fresh = ["r", 7, "loss is NaN"]
    assert json.loads(done.stdout) == [None, None, None, fresh, fresh]


def test_a_misspelt_option_is_rejected_with_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="did you mean 'layer_every'"):
        trainsentry_probe.watch(Net(), None, tmp_path, layers_every=10)


def test_the_nvml_sampler_reports_utilisation_and_memory() -> None:
    class FakeNvml:
        def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
            return type("U", (), {"gpu": 42})()

        def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
            return type("M", (), {"used": 123})()

    sampler = NvmlSampler(FakeNvml(), object(), 0.01, lambda v: None)
    assert sampler.sample() == {"gpu_util": 42.0, "gpu_mem_used": 123.0}
    assert NvmlSampler.start_for(torch.device("cpu"), 5.0, lambda v: None) is None


def test_the_probe_imports_neither_the_daemon_nor_the_trainer_libraries() -> None:
    code = (
        "import sys, trainsentry_probe, trainsentry_probe.probe;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('trainsentry', 'lightning', 'pytorch_lightning', 'transformers')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
