"""A training job without the probe, as most are: `python plain_job.py RUNDIR END >
RUNDIR/stdout.log`.

It writes RUNDIR/metrics.jsonl (a record a step, flushed) and a line a step to its
stdout, every 50 ms, and nothing that names its process. Once RUNDIR/stop exists
it ends as END says:

- `wait`: it never stops stepping (until it is killed);
- `clean`: it exits 0, with no word of its end (as a script's last line is);
- `fail`: it exits 3, with no traceback (`sys.exit(3)` after a check);
- `torn`: it writes part of a record, as a full buffer is flushed mid-line, and
  waits to be killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    rundir, end = Path(sys.argv[1]), sys.argv[2]
    stop = rundir / "stop"
    with (rundir / "metrics.jsonl").open("a") as metrics:
        step = 0
        while end == "wait" or not stop.exists():
            loss = 2.0 / (1 + step / 50)
            metrics.write(json.dumps({"step": step, "time": time.time(), "loss": loss}) + "\n")
            metrics.flush()
            print(f"step {step} loss {loss:.4f}", flush=True)
            step += 1
            time.sleep(0.05)
        if end == "fail":
            print("giving up: the validation set is empty", flush=True)
            sys.exit(3)
        if end == "torn":
            metrics.write(json.dumps({"step": step, "time": time.time(), "loss": 1.0})[:20])
            metrics.flush()
            time.sleep(600)


if __name__ == "__main__":
    main()
