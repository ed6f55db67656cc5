"""Load benchmark: one real daemon, many live runs, numbers printed (nothing asserted).

A generator process appends one point per series per tick to RUNS runs x TAGS
series (most as JSONL, a share as TensorBoard event files written with
tensorboard's own EventFileWriter), while `trainsentry run` watches the root.
Printed: points/s the daemon sustained (from its /metrics), lag from writing a
NaN to its alert appearing in --alerts-jsonl (p50/p95 over TRIALS
injections, each in a fresh run so the rule fires anew), and the daemon's CPU
(share of one core over the steady phase) and RSS.

    python bench/load.py --runs 200 --tags 20 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory


def generate(root: str, runs: int, tags: int, tick: float, tb_share: float, stop_at: float) -> None:
    """The fleet of training jobs: one record per run per tick until `stop_at`."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    names = ["loss"] + [f"metric_{i}" for i in range(1, tags)]
    n_tb = int(runs * tb_share)
    jsonl = []
    tb = []
    for r in range(runs):
        d = Path(root) / f"run{r:05d}"
        d.mkdir(parents=True, exist_ok=True)
        if r < n_tb:
            tb.append(EventFileWriter(str(d), flush_secs=1))
        else:
            jsonl.append(open(d / "metrics.jsonl", "a", buffering=1 << 16))  # noqa: SIM115
    step = 0
    next_tick = time.monotonic()
    while time.time() < stop_at:
        now = time.time()
        for f in jsonl:
            rec = {"step": step, "time": now}
            rec.update((n, 1.0 / (step + 1 + i)) for i, n in enumerate(names))
            f.write(json.dumps(rec) + "\n")
            f.flush()
        for w in tb:
            values = [
                summary_pb2.Summary.Value(tag=n, simple_value=1.0 / (step + 1 + i))
                for i, n in enumerate(names)
            ]
            w.add_event(
                event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=values))
            )
            w.flush()
        step += 1
        next_tick += tick
        time.sleep(max(0.0, next_tick - time.monotonic()))
    for f in jsonl:
        f.close()
    for w in tb:
        w.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def points_read(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^trainsentry_points_read_total ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def inject_nan(root: Path, trial: int) -> float:
    """A fresh run whose first point is a NaN loss; the write time."""
    d = root / f"nan{trial:03d}"
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as f:
        t = time.time()
        f.write(json.dumps({"step": 0, "time": t, "loss": float("nan")}) + "\n")
    return t


def wait_alert(alerts: Path, run: str, offset: int, timeout: float = 30) -> tuple[float, int]:
    """When the firing transition for `run` appeared in the alerts file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(alerts, encoding="utf-8") as f:
            f.seek(offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                offset += len(line.encode())
                t = json.loads(line)
                if t["run"] == run and t["state"] == "firing":
                    return time.time(), offset
        time.sleep(0.01)
    return float("nan"), offset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tags", type=int, default=20)
    ap.add_argument("--tick", type=float, default=1.0, help="seconds between points of a series")
    ap.add_argument("--tb-share", type=float, default=0.2, help="share of runs as tfevents")
    ap.add_argument("--seconds", type=float, default=30, help="steady phase measured")
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()

    with TemporaryDirectory() as tmp:
        root, state, alerts = Path(tmp) / "logs", Path(tmp) / "state", Path(tmp) / "alerts.jsonl"
        root.mkdir()
        alerts.touch()
        warmup = 5.0
        stop_at = time.time() + warmup + args.seconds + args.trials * 1.0 + 10
        gen = mp.Process(
            target=generate,
            args=(str(root), args.runs, args.tags, args.tick, args.tb_share, stop_at),
        )
        gen.start()
        port = free_port()
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainsentry",
                "run",
                str(root),
                "--state-dir",
                str(state),
                "--http",
                f"127.0.0.1:{port}",
                "--alerts-jsonl",
                str(alerts),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(warmup)
            p0, c0, t0 = points_read(port), cpu_seconds(daemon.pid), time.monotonic()
            rss_peak = 0.0
            while time.monotonic() - t0 < args.seconds:
                time.sleep(1)
                rss_peak = max(rss_peak, rss_mb(daemon.pid))
            p1, c1, t1 = points_read(port), cpu_seconds(daemon.pid), time.monotonic()
            lags: list[float] = []
            offset = 0
            for trial in range(args.trials):
                written = inject_nan(root, trial)
                seen, offset = wait_alert(alerts, f"nan{trial:03d}", offset)
                lags.append(seen - written)
                time.sleep(0.5)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
            gen.terminate()
            gen.join()

    written_rate = args.runs * args.tags / args.tick
    ok = sorted(x for x in lags if x == x)
    print(
        f"load: {args.runs} runs x {args.tags} series, one point each every {args.tick:g} s "
        f"({args.tb_share:.0%} tfevents): {written_rate:,.0f} points/s written"
    )
    print(f"sustained: {(p1 - p0) / (t1 - t0):,.0f} points/s read over {t1 - t0:.0f} s")
    print(f"daemon CPU: {100 * (c1 - c0) / (t1 - t0):.1f}% of one core; RSS peak {rss_peak:.0f} MB")
    if ok:
        p95 = ok[min(len(ok) - 1, round(0.95 * (len(ok) - 1)))]
        print(
            f"NaN write -> alert lag over {len(ok)}/{len(lags)} trials: "
            f"p50 {statistics.median(ok):.3f} s, p95 {p95:.3f} s, max {ok[-1]:.3f} s"
        )
    else:
        print("NaN write -> alert: no alert seen")


if __name__ == "__main__":
    main()
