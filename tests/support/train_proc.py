"""A real (tiny) training job for the end-to-end tests: torch on the CPU, a real writer.

Usage: python train_proc.py LOGDIR STEPS [DIVERGE_AT]
An MLP regresses a fixed random target with SGD; from DIVERGE_AT on the learning
rate ramps up 4% a step, past stability, so the loss and gradient norm grow
geometrically until they overflow — the slow-then-sudden failure trainsentry
exists to catch. Logs with HF Trainer's names through torch's SummaryWriter.
"""

from __future__ import annotations

import math
import sys

import torch
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    logdir, steps = sys.argv[1], int(sys.argv[2])
    diverge_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.sin(x @ torch.randn(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(logdir, flush_secs=1)
    bad = 0
    for step in range(steps):
        if 0 <= diverge_at <= step:
            for group in opt.param_groups:
                group["lr"] *= 1.04
        idx = torch.randint(0, 256, (32,))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        writer.add_scalar("train/learning_rate", opt.param_groups[0]["lr"], step)
        writer.flush()
        if not math.isfinite(loss.item()):
            bad += 1
            if bad > 5:
                break
    writer.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
