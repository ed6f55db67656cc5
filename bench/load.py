"""Load benchmark: one real daemon, many live runs, numbers printed (nothing asserted).

A generator process appends one point per series per tick to RUNS runs x TAGS
series (most as JSONL, a share as TensorBoard event files written with
tensorboard's own EventFileWriter), the runs' writes spread over the tick as
jobs out of phase would, while `trainsentry run` watches the root.
Printed: points/s the daemon sustained (from its /metrics), lag from writing a
NaN to its alert appearing in --alerts-jsonl (p50/p95/p99 over NaN injections
made all through the steady phase, each in a fresh run so the rule fires
anew), the daemon's CPU (share of one core over the steady phase, and per
minute so creep shows) against the writers' own CPU measured alongside, and
its RSS at the start and end of the phase (a leak shows as growth).

    python bench/load.py --runs 200 --tags 20 --seconds 30
    python bench/load.py --soak          # 1,000 runs for 10 minutes, a NaN every 2 s
    python bench/load.py --soak --prefill 4000   # the same with every window full (steady state)
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

SLICES = 20


def generate(
    root: str, runs: int, tags: int, tick: float, tb_share: float, stop_at: float, prefill: int = 0
) -> None:
    """The fleet of training jobs: one record per run per tick until `stop_at`.

    `prefill`: each run first gets that many steps of history (its loss only, a
    tick apart, ending now), so the rules' windows and the store's judged
    windows start full: the state an hours-old fleet is in, which a few minutes
    of live records do not reach (a "2000 steps" plateau fills in 67 minutes).
    """
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
    # Jobs are not in phase: a tick's writes are spread over it in SLICES groups,
    # so the daemon sees a steady stream of events rather than one burst a tick.
    writers: list[tuple[bool, object]] = [(False, f) for f in jsonl] + [(True, w) for w in tb]
    slices = [writers[i::SLICES] for i in range(SLICES)]
    start = time.time() - prefill * tick
    for step in range(prefill):
        wall = start + step * tick
        loss = 1.0 / (step + 1)
        for is_tb, out in writers:
            if is_tb:
                value = summary_pb2.Summary.Value(tag="loss", simple_value=loss)
                event = event_pb2.Event(
                    wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value])
                )
                out.add_event(event)  # type: ignore[attr-defined]
            else:
                out.write(f'{{"step": {step}, "time": {wall}, "loss": {loss}}}\n')  # type: ignore[attr-defined]
    for _, out in writers:
        out.flush()  # type: ignore[attr-defined]
    step = prefill
    next_slice = time.monotonic()
    while time.time() < stop_at:
        for group in slices:
            now = time.time()
            for is_tb, out in group:
                if is_tb:
                    values = [
                        summary_pb2.Summary.Value(tag=n, simple_value=1.0 / (step + 1 + i))
                        for i, n in enumerate(names)
                    ]
                    event = event_pb2.Event(
                        wall_time=now, step=step, summary=summary_pb2.Summary(value=values)
                    )
                    out.add_event(event)  # type: ignore[attr-defined]
                    out.flush()  # type: ignore[attr-defined]
                else:
                    rec = {"step": step, "time": now}
                    rec.update((n, 1.0 / (step + 1 + i)) for i, n in enumerate(names))
                    out.write(json.dumps(rec) + "\n")  # type: ignore[attr-defined]
                    out.flush()  # type: ignore[attr-defined]
            next_slice += tick / SLICES
            time.sleep(max(0.0, next_slice - time.monotonic()))
        step += 1
    for f in jsonl:
        f.close()
    for w in tb:
        w.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def points_read(port: int) -> float:
    return metric(port, "trainsentry_points_read_total")


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
    d = root / f"nan{trial:04d}"
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as f:
        t = time.time()
        f.write(json.dumps({"step": 0, "time": t, "loss": float("nan")}) + "\n")
    return t


class AlertTail:
    """When each NaN run's firing transition appeared in the daemon's --alerts-jsonl file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: dict[str, float] = {}

    def poll(self) -> None:
        now = time.time()
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                t = json.loads(line)
                if t["run"].startswith("nan") and t["state"] == "firing":
                    self.seen.setdefault(t["run"], now)


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tags", type=int, default=20)
    ap.add_argument("--tick", type=float, default=1.0, help="seconds between points of a series")
    ap.add_argument("--tb-share", type=float, default=0.2, help="share of runs as tfevents")
    ap.add_argument("--seconds", type=float, default=30, help="steady phase measured")
    ap.add_argument(
        "--inject-every", type=float, default=1.0, help="seconds between NaN injections"
    )
    ap.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="steps of history per run before the live phase (4000 fills every default window)",
    )
    ap.add_argument(
        "--soak",
        action="store_true",
        help="the issue's soak: 1,000 runs for 10 minutes (--runs/--seconds still apply if given)",
    )
    args = ap.parse_args()
    if args.soak:
        args.runs = 1000 if args.runs == ap.get_default("runs") else args.runs
        args.seconds = 600 if args.seconds == ap.get_default("seconds") else args.seconds
        args.inject_every = 2.0 if args.inject_every == 1.0 else args.inject_every

    with TemporaryDirectory() as tmp:
        root, state, alerts = Path(tmp) / "logs", Path(tmp) / "state", Path(tmp) / "alerts.jsonl"
        root.mkdir()
        alerts.touch()
        warmup = 10.0
        catch_up = 900.0 if args.prefill else 0.0  # at most, for writing and reading it
        stop_at = time.time() + catch_up + warmup + args.seconds + 30
        gen = mp.Process(
            target=generate,
            args=(
                str(root), args.runs, args.tags, args.tick, args.tb_share, stop_at, args.prefill
            ),
        )  # fmt: skip
        gen.start()
        port = free_port()
        daemon = subprocess.Popen(
            [
                sys.executable, "-m", "trainsentry", "run", str(root),
                "--state-dir", str(state), "--http", f"127.0.0.1:{port}",
                "--alerts-jsonl", str(alerts),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(said := open(Path(tmp) / "daemon.err", "w+")),  # noqa: SIM115
        )  # fmt: skip
        tail = AlertTail(alerts)
        written: dict[str, float] = {}
        windows: list[float] = []  # daemon CPU share per minute
        try:
            if args.prefill:
                began, history = time.monotonic(), args.runs * args.prefill
                while time.monotonic() - began < catch_up:
                    time.sleep(1.0)
                    try:
                        if points_read(port) >= history:
                            break
                    except OSError:
                        pass  # the API is not up yet
                print(f"prefill: {history:,} points of history read in "
                      f"{time.monotonic() - began:.0f} s")  # fmt: skip
            began = time.monotonic()
            while time.monotonic() - began < 60:  # the daemon's API up (a busy box starts slowly)
                try:
                    points_read(port)
                    break
                except OSError:
                    time.sleep(0.5)
            time.sleep(warmup)
            assert gen.pid is not None
            p0, t0, t0_wall = points_read(port), time.monotonic(), time.time()
            c0, g0 = cpu_seconds(daemon.pid), cpu_seconds(gen.pid)
            rss_start = rss_mb(daemon.pid)
            rss_peak = rss_start
            next_inject, window = t0, (t0, c0)
            while time.monotonic() - t0 < args.seconds:
                now = time.monotonic()
                if now >= next_inject:
                    written[f"nan{len(written):04d}"] = inject_nan(root, len(written))
                    next_inject += args.inject_every
                    rss_peak = max(rss_peak, rss_mb(daemon.pid))
                if now - window[0] >= 60:
                    c = cpu_seconds(daemon.pid)
                    windows.append((c - window[1]) / (now - window[0]))
                    window = (now, c)
                tail.poll()
                time.sleep(0.005)  # the lag's resolution
            p1, t1 = points_read(port), time.monotonic()
            c1, g1 = cpu_seconds(daemon.pid), cpu_seconds(gen.pid)
            rss_end = rss_mb(daemon.pid)
            rss_peak = max(rss_peak, rss_end)
            saves = metric(port, "trainsentry_alert_state_saves_total")
            save_seconds = metric(port, "trainsentry_alert_state_save_duration_seconds")
            save_mb = metric(port, "trainsentry_alert_state_bytes") / 1e6
            deadline = time.monotonic() + 30  # the last injections' alerts
            while len(tail.seen) < len(written) and time.monotonic() < deadline:
                tail.poll()
                time.sleep(0.01)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
            gen.terminate()
            gen.join()
            said.seek(0)
            warnings = said.read().splitlines()
            said.close()

    elapsed = t1 - t0
    written_rate = args.runs * args.tags / args.tick
    lags = sorted(tail.seen[run] - t for run, t in written.items() if run in tail.seen)
    cpu = (c1 - c0) / elapsed
    gen_cpu = (g1 - g0) / elapsed
    print(
        f"load: {args.runs} runs x {args.tags} series, one point each every {args.tick:g} s "
        f"({args.tb_share:.0%} tfevents): {written_rate:,.0f} points/s written, "
        f"{elapsed:.0f} s measured"
    )
    print(f"sustained: {(p1 - p0) / elapsed:,.0f} points/s read")
    print(
        f"daemon CPU: {100 * cpu:.1f}% of one core (target < 10%); the writers' own CPU "
        f"{100 * gen_cpu:.1f}%: the daemon used {cpu / gen_cpu:.2f}x what writing the logs cost"
    )
    if windows:
        print(f"  per minute: {', '.join(f'{100 * w:.0f}%' for w in windows)}")
    print(
        f"daemon RSS: {rss_start:.0f} MB at the start of the phase, {rss_end:.0f} MB at its end, "
        f"peak {rss_peak:.0f} MB (target < 300 MB)"
    )
    print(
        f"alert-state snapshots: {saves:.0f} taken, the last in {save_seconds:.2f} s "
        f"({save_mb:.1f} MB)"
    )
    if lags:
        print(
            f"NaN write -> alert lag over {len(lags)}/{len(written)} injections: "
            f"p50 {statistics.median(lags):.3f} s, p95 {percentile(lags, 0.95):.3f} s, "
            f"p99 {percentile(lags, 0.99):.3f} s, max {lags[-1]:.3f} s (target p99 < 2 s)"
        )
        slow = sorted(
            ((tail.seen[r] - t, t - t0_wall) for r, t in written.items() if r in tail.seen),
            reverse=True,
        )[:3]
        print("  slowest: " + ", ".join(f"{lag:.2f} s at +{at:.0f} s" for lag, at in slow))
    else:
        print("NaN write -> alert: no alert seen")
    # a warning (a watch limit, a fallback to polling) changes what was measured
    for line in warnings[:10]:
        print(f"daemon said: {line}")


if __name__ == "__main__":
    main()
