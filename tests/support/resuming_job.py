"""A job that checkpoints as HF's Trainer lays them out and resumes from its last one, as
a requeued or restarted job does: `python resuming_job.py RUNDIR UNTIL [crash]`.

It appends a record a step to RUNDIR/metrics.jsonl (flushed) and a line to its stdout,
and every 10 steps saves RUNDIR/checkpoint-<step>/ (its weights, then
`trainer_state.json` last, as the Trainer does). It begins after the newest checkpoint
holding `trainer_state.json`, or at step 0, and runs to step UNTIL; with `crash`, it then
starts a save it never finishes (a folder without its last file) and raises.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

EVERY = 10


def resumed_from(rundir: Path) -> int | None:
    done = [
        int(p.name.split("-")[1])
        for p in rundir.glob("checkpoint-*")
        if (p / "trainer_state.json").exists()
    ]
    return max(done, default=None)


def save(rundir: Path, step: int, *, last_file: bool = True) -> None:
    folder = rundir / f"checkpoint-{step}"
    folder.mkdir(exist_ok=True)  # a save a crash left half-written is written again
    (folder / "model.safetensors").write_bytes(b"w" * 4096)
    if last_file:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def main() -> None:
    rundir, until = Path(sys.argv[1]), int(sys.argv[2])
    crash = sys.argv[3:] == ["crash"]
    start = resumed_from(rundir)
    first = 0 if start is None else start + 1
    print(f"resuming from step {start}" if start is not None else "starting", flush=True)
    with (rundir / "metrics.jsonl").open("a") as metrics:
        for step in range(first, until + 1):
            loss = 2.0 / (1 + step / 50)
            metrics.write(json.dumps({"step": step, "time": time.time(), "loss": loss}) + "\n")
            metrics.flush()
            print(f"step {step} loss {loss:.4f}", flush=True)
            if step and step % EVERY == 0:
                save(rundir, step)
            time.sleep(0.05)
    if crash:
        save(rundir, until + EVERY - until % EVERY, last_file=False)
        raise RuntimeError("the data shard went missing")


if __name__ == "__main__":
    main()
