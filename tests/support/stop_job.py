"""A training job with the probe that honours trainsentry's stop file (for test_stop_chain).

Usage: python stop_job.py LOGDIR MAX_STEPS
An MLP regresses a fixed target with SGD whose learning rate ramps 3% a step
from step 100: the gradient norm grows until the daemon's critical rule writes
the stop file; the loop then saves a "checkpoint" and exits. Prints
"stopped at step N" or "ran to the end".
"""

from __future__ import annotations

import sys

import torch

import trainsentry_probe


def main() -> None:
    logdir, max_steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.sin(x @ torch.randn(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    probe = trainsentry_probe.watch(model, opt, logdir, stop_every=5)
    for step in range(max_steps):
        if step >= 100:
            for group in opt.param_groups:
                group["lr"] = min(group["lr"] * 1.03, 0.5)
        idx = torch.randint(0, 256, (32,))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss=loss)
        if probe.should_stop():
            (torch.save(model.state_dict(), f"{logdir}/checkpoint.pt"))
            print(f"stopped at step {step}", flush=True)
            break
    else:
        print("ran to the end", flush=True)
    probe.close()


if __name__ == "__main__":
    main()
