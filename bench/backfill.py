"""Backfill benchmark: a daemon started on finished runs, against tbparse reading them.

The issue's case is an operator pointing a fresh daemon at a log root that
already holds a hundred finished runs: how long until it is live ("caught
up" on stderr)? The daemon does more than read: every point goes through the
shipped rule pack and into the store, and offsets are committed to SQLite.
The peer is tbparse reading the same files into a DataFrame, run by run (one
SummaryReader over the whole root would hold every point at once, gigabytes
at the full size), in its own process, timed in the same run.

The runs are written once by torch's SummaryWriter (the writer most training
jobs use) and cached under bench/.cache/backfill_<runs>x<points>/.

    python bench/backfill.py                      # 100 runs x 100,000 points
    python bench/backfill.py --runs 10 --points 20000   # a quick run
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from cache import cached

TAGS = 10


def _write_run(directory: str, steps: int, seed: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(directory, max_queue=100_000, flush_secs=3600)
    names = ["loss", "grad_norm", "lr"] + [f"metric_{t}" for t in range(TAGS - 3)]
    for step in range(steps):
        base = math.exp(-step / (steps / 3 + 1)) * (1 + seed % 7)
        for t, name in enumerate(names):
            writer.add_scalar(name, base * (1 + t) + 0.01 * math.sin(step * 0.37 + t + seed), step)
    writer.close()


def dataset(runs: int, points: int, workers: int) -> Path:
    """The cached root of `runs` finished runs of `points` scalars each."""

    def write(root: Path) -> None:
        jobs = [(str(root / f"run{r:03d}"), points // TAGS, r) for r in range(runs)]
        with mp.get_context("spawn").Pool(workers) as pool:
            pool.starmap(_write_run, jobs)

    what = f"{runs} runs x {points:,} points with torch's SummaryWriter"
    return cached(f"backfill_{runs}x{points}", write, what)


def time_daemon(root: Path) -> tuple[float, str, int]:
    """Seconds from starting `trainsentry run` with a fresh state dir to its "caught up"
    line, and the daemon's peak resident memory (kB) by then."""
    with TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "trainsentry", "run", str(root)]
        cmd += ["--state-dir", str(Path(tmp) / "state"), "--http", "off"]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        line = ""
        try:
            for line in proc.stderr:
                if "caught up" in line:
                    break
            else:
                raise SystemExit(f"the daemon ended without catching up (rc {proc.wait()})")
            elapsed = time.monotonic() - start
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = next(int(s.split()[1]) for s in status.splitlines() if s.startswith("VmHWM"))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return elapsed, line.strip(), peak


def _tbparse_child(root: str, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    from tbparse import SummaryReader

    n = 0
    for run in sorted(os.listdir(root)):
        n += len(SummaryReader(os.path.join(root, run), event_types={"scalars"}).scalars)
    queue.put(n)


def time_tbparse(root: Path) -> tuple[float, int]:
    """tbparse in a fresh process, its import included as the daemon's is."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = time.monotonic()
    proc = ctx.Process(target=_tbparse_child, args=(str(root), queue))
    proc.start()
    n = int(queue.get())
    elapsed = time.monotonic() - start
    proc.join()
    return elapsed, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--points", type=int, default=100_000, help="scalars per run")
    ap.add_argument("--workers", type=int, default=2, help="processes writing the dataset")
    ap.add_argument("--no-tbparse", action="store_true", help="time the daemon only")
    args = ap.parse_args()

    root = dataset(args.runs, args.points, args.workers)
    total = args.runs * (args.points // TAGS) * TAGS
    daemon_s, line, peak_kb = time_daemon(root)
    print(f"backfill: {args.runs} runs x {args.points:,} points ({total:,} points, torch writer)")
    print(
        f"trainsentry run: caught up in {daemon_s:.1f} s, {total / daemon_s:,.0f} points/s,"
        f" peak RSS {peak_kb / 1024:.0f} MiB"
    )
    print(f"  ({line})")
    if args.no_tbparse:
        return
    tb_s, n = time_tbparse(root)
    print(f"tbparse, run by run: {tb_s:.1f} s, {n / tb_s:,.0f} points/s ({n:,} points)")
    print(f"ratio: the daemon caught up {tb_s / daemon_s:.2f}x as fast as tbparse read")


if __name__ == "__main__":
    main()
