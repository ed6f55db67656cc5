"""The trainer adapters write where the trainer's own logs go: one job, one run.

A job whose probe file sits in one directory and whose TensorBoard events sit
in another is two runs to the daemon; a rule on the TensorBoard run would page
on its own and its stop file would land where the probe never looks. Each test
runs a real tiny trainer on the CPU with its real logger, writes the daemon's
stop file for the run the daemon sees, and checks the job stopped there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import read_file
from support.ranks import run_ranks
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

discover = pytest.importorskip("trainsentry.sources.discover")
stop_file = pytest.importorskip("trainsentry.actions.stop_file")
alert = pytest.importorskip("trainsentry.alert")
jobs = pytest.importorskip("trainsentry.jobs")

PROBE_FILE = "trainsentry-probe.jsonl"


def runs_under(root: Path) -> dict[str, set[str]]:
    """What the daemon sees under `root`: run id -> the names of its log files."""
    runs: dict[str, set[str]] = {}
    for log in discover.Root.watched(root).scan():
        runs.setdefault(log.run, set()).add(log.path.name)
    return runs


def stop_run_of(root: Path, log: Path) -> None:
    """What the daemon's stop action does for a critical alert on the run of `log`."""
    described = discover.Root.watched(root).describe(log)
    assert described is not None, log
    path = stop_file.stop_file_path(described.run, log.parent, None)
    why = alert.Transition(described.run, "r", "critical", "firing", 2, 0.0, "loss", 1.0, "test")
    stop_file.write_stop_file(path, why)


def probed_steps(logdir: Path) -> int:
    return len(read_file(logdir / PROBE_FILE)[1])


# ---- HF Trainer ---------------------------------------------------------------------------


def hf_train(out: Path, report_to: list[str], callbacks: list[Any], max_steps: int = 8) -> Any:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    config.bos_token_id = config.eos_token_id = 0
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (32, 8))
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        report_to=report_to,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=[{"input_ids": t, "labels": t} for t in tokens],
        callbacks=callbacks,
    )
    trainer.train()
    return trainer


def hf_stop_at(out: Path, step: int) -> Any:
    """A callback that, at `step`, stops the run the daemon sees HF's TensorBoard events in."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step:
                (events,) = out.rglob("events.out.tfevents*")
                stop_run_of(out, events)

    return StopAt()


def test_the_hf_callback_writes_beside_the_trainers_tensorboard_events(tmp_path: Path) -> None:
    from trainsentry_probe.hf import TrainsentryCallback

    out = tmp_path / "out"
    trainer = hf_train(
        out, ["tensorboard"], [hf_stop_at(out, 2), TrainsentryCallback(stop_every=1)]
    )
    ((run, files),) = runs_under(out).items()  # one job, one run
    assert PROBE_FILE in files and any("tfevents" in f for f in files)
    assert run.startswith("runs/")  # HF's dated logging directory
    assert trainer.state.global_step == 2  # the stop written for that run was seen
    assert probed_steps(out / run) == 2


def test_the_hf_callback_follows_the_tensorboard_logging_dir_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainsentry_probe.hf import TrainsentryCallback

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "out" / "tb"))
    hf_train(tmp_path / "out", ["tensorboard"], [TrainsentryCallback()], max_steps=2)
    assert runs_under(tmp_path / "out").keys() == {"tb"}
    assert probed_steps(tmp_path / "out" / "tb") == 2


def test_the_hf_callback_placed_before_tensorboards_shares_its_directory(tmp_path: Path) -> None:
    from transformers.integrations import TensorBoardCallback

    from trainsentry_probe.hf import TrainsentryCallback

    out = tmp_path / "out"
    hf_train(out, [], [TrainsentryCallback(), TensorBoardCallback()], max_steps=2)
    ((run, files),) = runs_under(out).items()
    assert run.startswith("runs/") and PROBE_FILE in files and len(files) == 2


def test_without_tensorboard_the_hf_callback_writes_in_the_output_dir(tmp_path: Path) -> None:
    from trainsentry_probe.hf import TrainsentryCallback

    out = tmp_path / "out"

    def stop_output_dir_at_2() -> Any:
        from transformers import TrainerCallback

        class StopAt(TrainerCallback):  # type: ignore[misc]
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if state.global_step == 2:
                    stop_run_of(out, out / PROBE_FILE)

        return StopAt()

    trainer = hf_train(out, [], [stop_output_dir_at_2(), TrainsentryCallback(stop_every=1)])
    assert runs_under(out) == {"out": {PROBE_FILE}}
    assert trainer.state.global_step == 2


HF_WORKER = """
import os, socket, sys
import torch, transformers
from trainsentry_probe.hf import TrainsentryCallback

out, rank = sys.argv[1], int(os.environ["RANK"])
if rank == 1:  # as on a second node: HF's dated directory carries the host name
    socket.gethostname = lambda: "node1"
torch.manual_seed(0)
config = transformers.GPT2Config(
    vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
)
tokens = torch.randint(0, 50, (32, 8))
args = transformers.TrainingArguments(
    output_dir=out, max_steps=2, per_device_train_batch_size=4, report_to=["tensorboard"],
    save_strategy="no", use_cpu=True, disable_tqdm=True, ddp_backend="gloo",
)
transformers.Trainer(
    model=transformers.GPT2LMHeadModel(config), args=args,
    train_dataset=[{"input_ids": t, "labels": t} for t in tokens],
    callbacks=[TrainsentryCallback()],
).train()
# gloo's threads outlive an exit that skips this, and may abort the process on the way out
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
"""


def test_in_a_distributed_hf_job_every_rank_writes_into_rank_0s_run(tmp_path: Path) -> None:
    """Each rank's file is a run of its own, a rank of the job that rank 0's directory is."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    script = tmp_path / "worker.py"
    script.write_text(HF_WORKER)
    out = tmp_path / "out"
    run_ranks(script, str(out))
    runs = runs_under(out)
    [job] = [run for run in runs if not jobs.member_of(run).ranked]  # the Trainer's TensorBoard run
    assert not job.endswith("node1")  # rank 0's directory
    assert runs[f"{job}/rank0"] == {"trainsentry-probe.rank0.jsonl"}
    assert runs[f"{job}/rank1"] == {"trainsentry-probe.rank1.jsonl"}
    assert {jobs.member_of(run).job for run in runs} == {job}


# ---- Lightning ----------------------------------------------------------------------------


@pytest.mark.parametrize("logger_name", ["TensorBoardLogger", "CSVLogger"])
def test_the_lightning_callback_writes_in_its_loggers_run_directory(
    tmp_path: Path, logger_name: str
) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from trainsentry_probe.lightning import TrainsentryCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class StopAt(pl.Callback):  # type: ignore[misc]
        """At step 2, the daemon's stop for the run holding the logger's directory."""

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                logs = discover.Root.watched(Path(trainer.logger.log_dir)).scan()
                stop_run_of(out, logs[0].path)  # the logger's file

    out = tmp_path / "logs"
    flush = {"flush_logs_every_n_steps": 1} if logger_name == "CSVLogger" else {}
    logger = getattr(pl.loggers, logger_name)(save_dir=out, **flush)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 4, (128,)))
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        logger=logger,
        log_every_n_steps=1,
        max_steps=12,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopAt(), TrainsentryCallback(stop_every=1)],
    )
    trainer.fit(Module(), DataLoader(data, batch_size=8))
    ((run, files),) = runs_under(out).items()  # the probe's file and the logger's, one run
    assert PROBE_FILE in files and len(files) == 2
    assert run == "lightning_logs/version_0"
    assert trainer.global_step == 2
    assert probed_steps(out / run) == 2
