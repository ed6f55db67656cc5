"""A real torch loop whose first steps are slow and which slows down later:
`python warmup_job.py RUNDIR`.

Its data loader reads a cold cache for the first WARM steps (a sleep a batch, as a
first epoch from network storage costs), then settles at 20 ms a step, and
from SLOW_FROM on is starved again for SLOW_STEPS steps at the warm-up's pace. It
logs its loss every step through torch's SummaryWriter, flushed each step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

from support.toy_task import separable

WARM = 40
SLOW_FROM = 160
SLOW_STEPS = 30
STEPS = SLOW_FROM + SLOW_STEPS + 20
COLD = 0.2  # seconds a batch from the cold cache: ×10 the settled pace
# A settled step of 20 ms, not a few: a busy CI machine adds ms to every step, and
# at 5 ms that alone tripled the pace for a second (a true slowdown, but not this one).
SETTLED = 0.02


def main() -> None:
    rundir = Path(sys.argv[1])
    torch.set_num_threads(1)  # no thread of its own contending with the daemon's
    x, y = separable(512)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = SummaryWriter(str(rundir))
    for step in range(STEPS):
        starved = step < WARM or SLOW_FROM <= step < SLOW_FROM + SLOW_STEPS
        time.sleep(COLD if starved else SETTLED)
        batch = torch.randint(0, len(x), (32,))
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.flush()
    writer.close()


if __name__ == "__main__":
    main()
