"""The cost of one look for a run's writer: a pass over /proc (runtime/writers.py).

Starts PROCESSES processes (half `sleep`, half Python holding 8 files open for
writing, as a job's ranks and workers would), one more writing the target file,
and times `writers.scan` for that file: median and min over 20 passes, with the
processes and descriptors on the host. A pass reads every process's fd links, so
its cost is the host's descriptors, not the runs looked for.

    python bench/writer_scan.py --processes 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))

from trainsentry.runtime import writers

HOLDER = (
    "import os, sys, time\n"
    "files = [open(os.path.join(sys.argv[1], f'{os.getpid()}-{i}'), 'w') for i in range(8)]\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def descriptors() -> tuple[int, int]:
    processes = fds = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fds += len(os.listdir(f"/proc/{name}/fd"))
                processes += 1
            except OSError:
                pass
    return processes, fds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    with TemporaryDirectory() as tmp:
        target = Path(tmp, "metrics.jsonl")
        started = [subprocess.Popen(["sleep", "600"]) for _ in range(args.processes // 2)]
        holders = [
            subprocess.Popen(
                [sys.executable, "-S", "-c", HOLDER, tmp], stdout=subprocess.PIPE, text=True
            )
            for _ in range(args.processes - args.processes // 2)
        ]
        job = subprocess.Popen(
            [sys.executable, "-S", "-c", HOLDER.replace("range(8)", "range(0)"), tmp],
            stdout=target.open("w"),
        )
        try:
            for h in holders:
                assert h.stdout is not None and h.stdout.readline().strip() == "ready"
            time.sleep(0.5)
            processes, fds = descriptors()
            times = []
            found = {}
            for _ in range(args.passes):
                began = time.perf_counter()
                found = writers.scan({str(target): str(target.resolve())})
                times.append(time.perf_counter() - began)
        finally:
            for p in [*started, *holders, job]:
                p.kill()
            for p in [*started, *holders, job]:
                p.wait()
    assert found[str(target)].pid == job.pid, found
    median = statistics.median(times)
    print(
        f"{processes} processes, {fds} descriptors: a pass {median * 1e3:.1f} ms median, "
        f"{min(times) * 1e3:.1f} ms min ({median / fds * 1e6:.1f} µs a descriptor)"
    )


if __name__ == "__main__":
    main()
