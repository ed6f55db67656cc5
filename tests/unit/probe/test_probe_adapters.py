"""The Lightning and HF Trainer adapters in real, tiny trainer runs on the CPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import read
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def records(logdir: Path) -> list[dict[str, Any]]:
    return read(logdir)[1]


def request_stop(logdir: Path) -> None:
    """A stop file stamped in the future, so it counts as written during the run."""
    stop = logdir / ".trainsentry" / "STOP"
    stop.parent.mkdir(parents=True, exist_ok=True)
    stop.write_text(json.dumps({"rule": "r", "step": 1, "reason": "test"}))
    later = time.time() + 60
    os.utime(stop, (later, later))


def test_the_lightning_callback_records_a_fit_and_honours_a_stop(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from trainsentry_probe.lightning import TrainsentryCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"width": 16})
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))

    def fit(root: Path, max_steps: int) -> None:
        trainer = pl.Trainer(
            default_root_dir=root,
            max_steps=max_steps,
            logger=False,
            accelerator="cpu",
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            gradient_clip_val=1e-3,
            callbacks=[TrainsentryCallback(layer_every=2, sample_every=3, stop_every=1)],
        )
        trainer.fit(Module(), DataLoader(data, batch_size=8))

    fit(tmp_path / "a", 6)
    got = records(tmp_path / "a")
    assert [r["step"] for r in got] == list(range(6))
    assert all(r["probe/loss"] > 0 and r["probe/grad_norm"] > 1e-3 for r in got)  # not clipped
    assert "probe/grad_norm/net.0" in got[2] and "probe/update_ratio/net.2" in got[4]
    assert "probe/dead_fraction/net.1" in got[3]
    assert all("probe/data_wait" in r for r in got[1:])

    request_stop(tmp_path / "b")
    fit(tmp_path / "b", 50)
    assert len(records(tmp_path / "b")) == 1  # stopped at the end of the first batch


def test_the_lightning_callback_unscales_and_counts_skips_under_16_mixed(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.plugins.precision import MixedPrecision

    from trainsentry_probe.lightning import TrainsentryCallback

    class Module(pl.LightningModule):
        """Overflows at step 2; records the unscaled norm Lightning's clipping sees."""

        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.norms: dict[int, float] = {}
            self.overflow: Any = None

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if self.global_step == 2:
                self.overflow = self.net[0].weight.register_hook(lambda g: g * float("inf"))
            return F.cross_entropy(self.net(x), y)

        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            self.norms[self.global_step] = float(
                nn.utils.clip_grad_norm_(self.parameters(), 1e9)  # after unscale_, here
            )
            if self.overflow is not None:  # the inf was for one step
                self.overflow.remove()
                self.overflow = None

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    module = Module()
    pl.Trainer(
        default_root_dir=tmp_path,
        max_steps=5,
        logger=False,
        accelerator="cpu",
        # Lightning swaps "16-mixed" for bf16 on the CPU; the plugin itself keeps fp16
        plugins=[MixedPrecision("16-mixed", "cpu")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TrainsentryCallback()],
    ).fit(module, DataLoader(data, batch_size=8))
    got = records(tmp_path)
    assert [r["step"] for r in got] == list(range(5))  # as Lightning's global_step counts
    assert [r["probe/amp_skipped"] for r in got] == [0, 0, 1, 0, 0]
    assert got[3]["probe/grad_scale"] == got[2]["probe/grad_scale"] / 2
    applied = [r["probe/grad_norm"] for r in got if not r["probe/amp_skipped"]]
    assert applied == pytest.approx([module.norms[s] for s in (0, 1, 3, 4)], rel=1e-5)


def test_the_hf_callback_records_a_trainer_run(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from trainsentry_probe.hf import TrainsentryCallback

    config = transformers.GPT2Config(
        vocab_size=50,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(0, 50, (16, 8))
    dataset = [{"input_ids": t, "labels": t} for t in tokens]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=3,
    )
    callback = TrainsentryCallback(logdir=tmp_path, layer_every=2, sample_every=2)
    transformers.Trainer(
        model=model, args=args, train_dataset=dataset, callbacks=[callback]
    ).train()
    got = records(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3, 4]  # HF numbers steps from 1
    assert all(r["probe/loss"] > 0 and r["probe/grad_norm"] > 0 for r in got)
    assert any(k.startswith("probe/grad_norm/transformer.h.0") for k in got[1])
    assert "probe/embed_norm_spread/transformer.wte" in got[1]
    meta = json.loads((tmp_path / "trainsentry-probe.jsonl").read_text().splitlines()[0])
    assert meta["seed"] == 3 and meta["hparams"]["gradient_accumulation_steps"] == 2
    end = json.loads((tmp_path / "trainsentry-probe.jsonl").read_text().splitlines()[-1])
    assert (end["kind"], end["exit"], end["step"]) == ("end", "clean", 4)  # at train end
