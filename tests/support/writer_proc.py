"""A training job's logging, run as a separate process by the live tests.

Usage: python writer_proc.py KIND LOGDIR N
KIND: torch (torch.utils.tensorboard.SummaryWriter), tbx (tensorboardX), jsonl.
Writes N steps of `loss` and `grad_norm`, flushing after each step so the
daemon sees them as a live job with prompt flushing would produce them.
Prints "done" when finished.
"""

from __future__ import annotations

import json
import math
import sys
import time


def main() -> None:
    kind, logdir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "jsonl":
        import os

        os.makedirs(logdir, exist_ok=True)
        with open(os.path.join(logdir, "metrics.jsonl"), "a") as f:
            for step in range(n):
                rec = {"step": step, "time": time.time(), "loss": 1.0 / (step + 1)}
                rec["grad_norm"] = math.sqrt(step + 1)
                f.write(json.dumps(rec) + "\n")
                f.flush()
    else:
        if kind == "torch":
            from torch.utils.tensorboard import SummaryWriter
        else:
            from tensorboardX import SummaryWriter  # type: ignore[no-redef]
        writer = SummaryWriter(logdir, flush_secs=1)
        for step in range(n):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
            writer.add_scalar("grad_norm", math.sqrt(step + 1), step)
            writer.flush()
        writer.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
