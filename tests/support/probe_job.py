"""A real probe-watched training job for the run-life tests: python probe_job.py LOGDIR MODE.

A small MLP is trained with SGD on the CPU, a step every 50 ms, the probe
writing a record per step; from step 5 the recorded loss is NaN (a diverged
run that goes on). MODE says how the job ends:

- `forever`: it trains until it is killed (at most 20,000 steps);
- `finish`: 40 steps, then the probe closes (its end record) and it exits 0;
- `hang`: 20 steps, then it waits for LOGDIR/go to exist (a collective that
  never returns, a stuck data loader), then 20 more steps and a clean exit;
- `raise`: 20 steps, then an uncaught RuntimeError (the probe closes at exit).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import trainsentry_probe


def main() -> None:
    logdir, mode = Path(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(
        model, opt, logdir, transfer_every=1, layer_every=0, sample_every=0
    )
    steps = {"forever": 20_000, "finish": 40, "hang": 40, "raise": 20}[mode]
    for step in range(steps):
        if mode == "hang" and step == 20:
            print("waiting for go", flush=True)
            while not (logdir / "go").exists():
                time.sleep(0.05)
        x = torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        probe.record(loss=float("nan") if step >= 5 else loss.item())
        print(f"step {step}", flush=True)
        time.sleep(0.05)
    if mode == "raise":
        raise RuntimeError("the data shard went missing at step 20")
    probe.close()


if __name__ == "__main__":
    main()
