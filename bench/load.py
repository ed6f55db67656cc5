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

With `--ranks N` one invocation measures two fleets of the same RUNS runs one
after the other, each with a fresh daemon: RUNS single runs, then RUNS / N
jobs of N ranks (`job<j>/rank_<k>.jsonl`), the same records in both (loss,
data_time, grad_norm: what the cross-rank rules compare at every step), and
prints the ranks phase against the single phase: CPU (share of a core and per
1,000 runs or ranks), RSS (and per run), lag, the /metrics scrape. A NaN goes
into one rank of a fresh job of N ranks (N fresh runs in the single phase);
one rank of job 0 straggles, to show the comparisons run. Both phases first
get 256 + 64 steps of history (unless --prefill), so the comparisons'
learned spreads (256 compared steps) are full, as in a job an hour old.

    python bench/load.py --runs 200 --tags 20 --seconds 30
    python bench/load.py --soak          # 1,000 runs for 10 minutes, a NaN every 2 s
    python bench/load.py --soak --prefill 4000   # the same with every window full (steady state)
    python bench/load.py --ranks 8       # 800 single runs, then 100 jobs x 8 ranks
    python bench/load.py --ranks 8 --runs 1600 --seconds 60   # 200 jobs x 8 ranks
"""

from __future__ import annotations

import argparse
import json
import math
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
    root: str,
    runs: int,
    tags: int,
    tick: float,
    tb_share: float,
    stop_at: float,
    prefill: int = 0,
    *,
    ranks: int = 1,
    job_records: bool = False,
    straggler: int = -1,
) -> None:
    """The fleet of training jobs: one record per run per tick until `stop_at`.

    `prefill`: each run first gets that many steps of history (its loss only, a
    tick apart, ending now), so the rules' windows and the store's judged
    windows start full: the state an hours-old fleet is in, which a few minutes
    of live records do not reach (a "2000 steps" plateau fills in 67 minutes).
    With `job_records` the history is of loss, data_time and grad_norm, so the
    cross-rank comparisons' learned spreads start full too.

    `ranks` > 1: the runs are jobs of that many ranks, rank k of job j writing
    `job<j>/rank_<k>.jsonl` (the run `job<j>/rank<k>`); a job's ranks write one
    after the other, as ranks stepping together do. `job_records`: each record
    is a distributed job's (see `job_record`): what the `--ranks` comparison
    writes in both of its phases, so only the layout differs. `straggler`: the
    run (by index) whose data_time is 0.2 s, a straggling rank of job 0.
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    names = series_names(tags, job_records)
    noise = noise_table()
    n_tb = int(runs * tb_share)
    jsonl = []
    tb = []
    for r in range(runs):
        if ranks > 1:
            d = Path(root) / f"job{r // ranks:04d}"
            d.mkdir(parents=True, exist_ok=True)
            jsonl.append((r, open(d / f"rank_{r % ranks}.jsonl", "a", buffering=1 << 16)))  # noqa: SIM115
            continue
        d = Path(root) / f"run{r:05d}"
        d.mkdir(parents=True, exist_ok=True)
        if r < n_tb:
            tb.append((r, EventFileWriter(str(d), flush_secs=1)))
        else:
            jsonl.append((r, open(d / "metrics.jsonl", "a", buffering=1 << 16)))  # noqa: SIM115
    # Jobs are not in phase: a tick's writes are spread over it in SLICES groups,
    # so the daemon sees a steady stream of events rather than one burst a tick.
    # The ranks of one job step together: they fall in the same slice, one after another.
    writers: list[tuple[bool, int, object]] = [(False, r, f) for r, f in jsonl] + [
        (True, r, w) for r, w in tb
    ]
    writers.sort(key=lambda w: w[1])
    slices = [[w for w in writers if (w[1] // ranks) % SLICES == i] for i in range(SLICES)]
    start = time.time() - prefill * tick
    compared = names[:3]  # a job's history: the series compared across ranks
    for step in range(prefill):
        wall = start + step * tick
        loss = 1.0 / (step + 1)
        for is_tb, r, out in writers:
            if job_records:
                rec = job_record(compared, noise, r, step, wall, r == straggler)
                out.write(json.dumps(rec) + "\n")  # type: ignore[attr-defined]
            elif is_tb:
                value = summary_pb2.Summary.Value(tag="loss", simple_value=loss)
                event = event_pb2.Event(
                    wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value])
                )
                out.add_event(event)  # type: ignore[attr-defined]
            else:
                out.write(f'{{"step": {step}, "time": {wall}, "loss": {loss}}}\n')  # type: ignore[attr-defined]
    for _, _, out in writers:
        out.flush()  # type: ignore[attr-defined]
    step = prefill
    next_slice = time.monotonic()
    while time.time() < stop_at:
        for group in slices:
            now = time.time()
            for is_tb, r, out in group:
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
                    if job_records:
                        rec = job_record(names, noise, r, step, now, r == straggler)
                    else:
                        rec = {"step": step, "time": now}
                        rec.update((n, 1.0 / (step + 1 + i)) for i, n in enumerate(names))
                    out.write(json.dumps(rec) + "\n")  # type: ignore[attr-defined]
                    out.flush()  # type: ignore[attr-defined]
            next_slice += tick / SLICES
            time.sleep(max(0.0, next_slice - time.monotonic()))
        step += 1
    for _, _, out in writers:
        out.close()  # type: ignore[attr-defined]


def series_names(tags: int, job_records: bool) -> list[str]:
    """The series each run writes: `loss` then `metric_<i>`; a job's records put
    `data_time` and `grad_norm` second and third, the series the cross-rank rules
    compare at every step (rank_straggler: data_time as data_wait; rank_diverged:
    loss and grad_norm)."""
    if not job_records:
        return ["loss"] + [f"metric_{i}" for i in range(1, tags)]
    own = ["loss", "data_time", "grad_norm"][:tags]
    return own + [f"metric_{i}" for i in range(len(own), tags)]


NOISE = 4099  # a prime: (run, step) pairs walk the table without repeating in step


def noise_table() -> list[float]:
    import random

    rng = random.Random(20240611)
    return [rng.gauss(0.0, 1.0) for _ in range(NOISE)]


def job_record(
    names: list[str], noise: list[float], r: int, step: int, now: float, straggles: bool
) -> dict[str, float]:
    """One record of a rank of a data-parallel job: its loss within ~2 % of the other
    ranks' at the same step, its data_time ~5 ms (±20 %; 0.2 s for the straggler), its
    grad_norm ~1 (±10 %), the rest as the single runs' records."""
    z = (r * 131 + step * 17) % NOISE
    rec: dict[str, float] = {"step": step, "time": now}
    for i, n in enumerate(names):
        if n == "loss":
            rec[n] = (1.0 + 0.02 * noise[z]) / (step + 1)
        elif n == "data_time":
            rec[n] = max(0.001, (0.2 if straggles else 0.005) * (1.0 + 0.2 * noise[z - 1]))
        elif n == "grad_norm":
            rec[n] = 1.0 + 0.1 * noise[z - 2]
        else:
            rec[n] = 1.0 / (step + 1 + i)
    return rec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics_text(port: int) -> str:
    # a long timeout: a scrape of thousands of ranks from a busy daemon takes seconds
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()


def value_of(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def metric(port: int, name: str) -> float:
    return value_of(metrics_text(port), name)


def points_read(port: int) -> float:
    return metric(port, "trainsentry_points_read_total")


def caught_up(port: int, history: float, tick: float) -> bool:
    """The history read, and every run's newest point within two ticks of now."""
    text = metrics_text(port)
    if value_of(text, "trainsentry_points_read_total") < history:
        return False
    lags = [float(x) for x in re.findall(r"^trainsentry_run_lag_seconds\{.*\} (\S+)$", text, re.M)]
    return bool(lags) and max(lags) < 2 * tick


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def inject_nan(root: Path, trial: int, ranks: int = 1, batch: int = 1) -> float:
    """A fresh run whose first point is a NaN loss; the write time.

    `ranks` > 1: a fresh job of that many ranks, each writing its step 0, one of them
    (the last written) a NaN loss: the alert is that rank's, the job's first.
    `batch` > 1: as many fresh runs as a job's ranks, `pad<trial>_<k>` with a finite
    step 0 written first, then the NaN run: the single runs' peer of a fresh job, so
    both phases of the comparison start the same number of runs."""
    for k in range(batch - 1):
        d = root / f"pad{trial:04d}_{k}"
        d.mkdir()
        with open(d / "metrics.jsonl", "w") as f:
            f.write(json.dumps({"step": 0, "time": time.time(), "loss": 1.0}) + "\n")
    d = root / f"nan{trial:04d}"
    d.mkdir()
    if ranks > 1:
        bad = trial % ranks
        for k in [*range(bad), *range(bad + 1, ranks)]:
            with open(d / f"rank_{k}.jsonl", "w") as f:
                f.write(json.dumps({"step": 0, "time": time.time(), "loss": 1.0}) + "\n")
        with open(d / f"rank_{bad}.jsonl", "w") as f:
            t = time.time()
            f.write(json.dumps({"step": 0, "time": t, "loss": float("nan")}) + "\n")
        return t
    with open(d / "metrics.jsonl", "w") as f:
        t = time.time()
        f.write(json.dumps({"step": 0, "time": t, "loss": float("nan")}) + "\n")
    return t


class AlertTail:
    """When each NaN run's (or NaN job's) firing transition appeared in the daemon's
    --alerts-jsonl file; what fired on the fleet's own runs, which should be nothing
    but the planted straggler; and what else fired on the injected runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: dict[str, float] = {}
        self.fleet: dict[tuple[str, str], float] = {}  # (run, rule) → first firing seen
        self.injected: dict[str, int] = {}  # rule → firings on NaN and pad runs, but the NaN's

    def poll(self) -> None:
        now = time.time()
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                t = json.loads(line)
                if t["state"] != "firing":
                    continue
                run = t["run"]
                if run.startswith("nan") and run.split("/")[0] not in self.seen:
                    self.seen[run.split("/")[0]] = now
                elif run.startswith(("nan", "pad")):
                    self.injected[t["rule"]] = self.injected.get(t["rule"], 0) + 1
                else:
                    self.fleet.setdefault((run, t["rule"]), now)


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def busy_seconds() -> tuple[float, float]:
    """The machine's CPU seconds (busy, all), summed over its cores, from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hz, sum(ticks[:8]) / hz


def scrape(port: int, pid: int) -> dict:
    """One /metrics scrape as Prometheus takes it: its wall time, the daemon CPU over it
    (the caller takes off the loop's own share), its size, and how many rank series it
    exported (the fleet's jobs are `job<j>`, the NaN jobs `nan<i>`)."""
    c0, w0 = cpu_seconds(pid), time.monotonic()
    text = metrics_text(port)
    wall, cpu = time.monotonic() - w0, cpu_seconds(pid) - c0
    steps = re.findall(r"^trainsentry_rank_step\{.*$", text, re.M)
    refused = re.search(r"^trainsentry_runs_refused_total ([0-9.e+-]+)$", text, re.M)
    return {
        "wall": wall,
        "cpu": cpu,
        "bytes": len(text),
        "rank_step": len(steps),
        "fleet_rank_step": sum('job="job' in line for line in steps),
        "refused": float(refused.group(1)) if refused else 0.0,
        "text": text,
    }


def daemon_cmd(root: Path, state: Path, port: int, alerts: Path) -> list[str]:
    return [
        sys.executable, "-m", "trainsentry", "run", str(root),
        "--state-dir", str(state), "--http", f"127.0.0.1:{port}",
        "--alerts-jsonl", str(alerts),
    ]  # fmt: skip


def wait_for_api(port: int, limit: float = 60.0) -> None:
    began = time.monotonic()
    while time.monotonic() - began < limit:  # a busy box starts slowly
        try:
            points_read(port)
            return
        except OSError:
            time.sleep(0.5)


def idle_rss() -> float:
    """The RSS of a daemon with nothing to follow: what per-run RSS is counted above."""
    with TemporaryDirectory() as tmp:
        root, alerts = Path(tmp) / "logs", Path(tmp) / "alerts.jsonl"
        root.mkdir()
        port = free_port()
        daemon = subprocess.Popen(
            daemon_cmd(root, Path(tmp) / "state", port, alerts),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_api(port)
            time.sleep(2.0)
            return rss_mb(daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)


def measure(args: argparse.Namespace, ranks: int, job_records: bool, tb_share: float) -> dict:
    """One phase: a fresh daemon on a fresh fleet of `args.runs` runs (in jobs of `ranks`
    ranks when > 1), measured over its steady phase."""
    straggler = args.ranks - 1 if job_records and args.ranks > 2 else -1
    batch = args.ranks if job_records and ranks == 1 else 1  # fresh runs an injection
    with TemporaryDirectory() as tmp:
        root, state, alerts = Path(tmp) / "logs", Path(tmp) / "state", Path(tmp) / "alerts.jsonl"
        root.mkdir()
        alerts.touch()
        warmup = args.warmup
        catch_up = 900.0 if args.prefill else 0.0  # at most, for writing and reading it
        gen_start = time.time()
        stop_at = gen_start + catch_up + warmup + args.seconds + 30
        gen = mp.Process(
            target=generate,
            args=(
                str(root), args.runs, args.tags, args.tick, tb_share, stop_at, args.prefill
            ),
            kwargs={"ranks": ranks, "job_records": job_records, "straggler": straggler},
        )  # fmt: skip
        gen.start()
        port = free_port()
        daemon = subprocess.Popen(
            daemon_cmd(root, state, port, alerts),
            stdout=subprocess.DEVNULL,
            stderr=(said := open(Path(tmp) / "daemon.err", "w+")),  # noqa: SIM115
        )  # fmt: skip
        tail = AlertTail(alerts)
        prefill_s = math.nan
        written: dict[str, float] = {}
        windows: list[float] = []  # daemon CPU share per minute
        try:
            if args.prefill:
                per_step = min(3, args.tags) if job_records else 1
                began, history = time.monotonic(), args.runs * args.prefill * per_step
                # caught up: the history read, and the live points written meanwhile (every
                # run's newest point within two ticks of now); a scrape of thousands of ranks
                # costs the daemon a good part of a second, so asked every 10 s only
                while time.monotonic() - began < catch_up:
                    time.sleep(10.0)
                    try:
                        if caught_up(port, history, args.tick):
                            break
                    except OSError:
                        pass  # the API is not up yet
                prefill_s = time.monotonic() - began
                print(f"prefill: {history:,} points of history, and the live points written "
                      f"meanwhile, read in {prefill_s:.0f} s", flush=True)  # fmt: skip
            wait_for_api(port)
            time.sleep(warmup)
            assert gen.pid is not None
            p0, t0, t0_wall = points_read(port), time.monotonic(), time.time()
            c0, g0 = cpu_seconds(daemon.pid), cpu_seconds(gen.pid)
            m0 = busy_seconds()
            load0 = os.getloadavg()[0]
            rss_start = rss_mb(daemon.pid)
            rss_peak = rss_start
            next_inject, window = t0, (t0, c0)
            while time.monotonic() - t0 < args.seconds:
                now = time.monotonic()
                if now >= next_inject:
                    trial = len(written)
                    written[f"nan{trial:04d}"] = inject_nan(root, trial, ranks, batch)
                    next_inject += args.inject_every
                    rss_peak = max(rss_peak, rss_mb(daemon.pid))
                if now - window[0] >= 60:
                    c = cpu_seconds(daemon.pid)
                    windows.append((c - window[1]) / (now - window[0]))
                    window = (now, c)
                tail.poll()
                time.sleep(0.005)  # the lag's resolution
            t1 = time.monotonic()
            c1, g1 = cpu_seconds(daemon.pid), cpu_seconds(gen.pid)
            m1 = busy_seconds()
            load1 = os.getloadavg()[0]
            rss_end = rss_mb(daemon.pid)
            rss_peak = max(rss_peak, rss_end)
            # one scrape, after the CPU was read: its own cost is measured apart
            scraped = scrape(port, daemon.pid)
            scraped["cpu"] = max(0.0, scraped["cpu"] - scraped["wall"] * (c1 - c0) / (t1 - t0))
            text = scraped.pop("text")
            p1 = value_of(text, "trainsentry_points_read_total")
            saves = value_of(text, "trainsentry_alert_state_saves_total")
            save_seconds = value_of(text, "trainsentry_alert_state_save_duration_seconds")
            save_mb = value_of(text, "trainsentry_alert_state_bytes") / 1e6
            deadline = time.monotonic() + 30  # the last injections' alerts
            while len(tail.seen) < len(written) and time.monotonic() < deadline:
                tail.poll()
                time.sleep(0.01)
            tail.poll()
        finally:
            daemon.terminate()
            daemon.wait(timeout=120)
            gen.terminate()
            gen.join()
            said.seek(0)
            warnings = said.read().splitlines()
            said.close()
    elapsed = t1 - t0
    lags = sorted(tail.seen[run] - t for run, t in written.items() if run in tail.seen)
    slow = sorted(
        ((tail.seen[r] - t, t - t0_wall) for r, t in written.items() if r in tail.seen),
        reverse=True,
    )[:3]
    machine = (m1[0] - m0[0]) / elapsed, (m1[1] - m0[1]) / elapsed
    straggler_run = f"job0000/rank{straggler}" if ranks > 1 and straggler >= 0 else ""
    return {
        "runs": args.runs,
        "ranks": ranks,
        "elapsed": elapsed,
        "written": args.runs * args.tags / args.tick,
        "read": (p1 - p0) / elapsed,
        "cpu": (c1 - c0) / elapsed,
        "gen_cpu": (g1 - g0) / elapsed,
        "machine": machine,  # (busy cores, cores) on average over the phase
        "load": (load0, load1),
        "windows": windows,
        "rss": (rss_start, rss_end, rss_peak),
        "saves": (saves, save_seconds, save_mb),
        "scrape": scraped,
        "lags": lags,
        "injected": len(written),
        "slow": slow,
        "fleet": {k: v - gen_start for k, v in tail.fleet.items()},
        "injected_alerts": tail.injected,
        "prefill_s": prefill_s,
        "batch": max(batch, ranks),
        "straggler": straggler_run,
        "warnings": warnings,
    }


def report(res: dict, tb_share: float, label: str = "") -> None:
    """Print one phase as load.py always has."""
    elapsed, cpu, gen_cpu = res["elapsed"], res["cpu"], res["gen_cpu"]
    rss_start, rss_end, rss_peak = res["rss"]
    lags = res["lags"]
    shape = (
        f"{res['runs'] // res['ranks']} jobs x {res['ranks']} ranks"
        if res["ranks"] > 1
        else f"{res['runs']} runs"
    )
    print(
        f"{label}load: {shape} x {res['tags']} series, one point each every {res['tick']:g} s "
        f"({tb_share:.0%} tfevents): {res['written']:,.0f} points/s written, "
        f"{elapsed:.0f} s measured"
    )
    print(
        f"sustained: {res['read']:,.0f} points/s read "
        f"({res['read'] / res['written']:.0%} of what was written)"
    )
    print(
        f"daemon CPU: {100 * cpu:.1f}% of one core (target < 10%); the writers' own CPU "
        f"{100 * gen_cpu:.1f}%: the daemon used {cpu / gen_cpu:.2f}x what writing the logs cost"
    )
    if res["windows"]:
        print(f"  per minute: {', '.join(f'{100 * w:.0f}%' for w in res['windows'])}")
    busy, cores = res["machine"]
    print(
        f"  the machine: {busy:.2f} of {cores:.0f} cores busy, {busy - cpu - gen_cpu:.2f} of them "
        f"neither the daemon nor the writers; load average {res['load'][0]:.1f} -> "
        f"{res['load'][1]:.1f}"
    )
    print(
        f"daemon RSS: {rss_start:.0f} MB at the start of the phase, {rss_end:.0f} MB at its end, "
        f"peak {rss_peak:.0f} MB (target < 300 MB)"
    )
    saves, save_seconds, save_mb = res["saves"]
    print(
        f"alert-state snapshots: {saves:.0f} taken, the last in {save_seconds:.2f} s "
        f"({save_mb:.1f} MB)"
    )
    if lags:
        print(
            f"NaN write -> alert lag over {len(lags)}/{res['injected']} injections: "
            f"p50 {statistics.median(lags):.3f} s, p95 {percentile(lags, 0.95):.3f} s, "
            f"p99 {percentile(lags, 0.99):.3f} s, max {lags[-1]:.3f} s (target p99 < 2 s)"
        )
        print("  slowest: " + ", ".join(f"{lag:.2f} s at +{at:.0f} s" for lag, at in res["slow"]))
    else:
        print("NaN write -> alert: no alert seen")
    # a warning (a watch limit, a fallback to polling) changes what was measured
    for line in res["warnings"][:10]:
        print(f"daemon said: {line}")


def report_jobs(res: dict) -> None:
    """What a phase of the comparison adds: /metrics, what fired on the fleet."""
    s = res["scrape"]
    print(
        f"/metrics: one scrape {s['bytes'] / 1e6:.1f} MB in {s['wall']:.2f} s "
        f"(~{1000 * s['cpu']:.0f} ms of daemon CPU), {s['rank_step']:.0f} trainsentry_rank_step "
        f"series ({s['fleet_rank_step']:.0f} the fleet's, the rest the NaN jobs')"
        + (f"; {s['refused']:.0f} runs refused (MAX_RUNS)" if s["refused"] else "")
    )
    fleet = res["fleet"]
    planted = [k for k in fleet if k == (res["straggler"], "rank_straggler")]
    others = [k for k in fleet if k not in planted]
    if res["straggler"]:
        print(
            f"planted straggler {res['straggler']} (data_time 0.2 s vs ~5 ms): "
            + (
                f"rank_straggler fired {fleet[planted[0]]:.0f} s after the fleet began writing"
                if planted
                else "rank_straggler not seen (it holds for 1 min and 3 points: a longer phase)"
            )
        )
    if others:
        rules: dict[str, int] = {}
        for _, rule in others:
            rules[rule] = rules.get(rule, 0) + 1
        print(
            f"fired on the fleet's runs: {len(others)} alert(s): "
            + ", ".join(f"{rule} x{n}" for rule, n in sorted(rules.items()))
        )
    else:
        print("fired on the fleet's runs: nothing else")
    extra = res["injected_alerts"]
    print(
        f"injections: {res['injected']} x {res['batch']} fresh runs "
        + ("(a job of that many ranks, one NaN rank)" if res["ranks"] > 1 else "(one NaN run)")
        + (
            "; besides the NaNs, on them: "
            + ", ".join(f"{rule} x{n}" for rule, n in sorted(extra.items()))
            if extra
            else ""
        )
    )


def compare(single: dict, jobs: dict, idle: float) -> None:
    """The ranks phase against the single-run phase of the same invocation."""
    n = single["runs"]

    def per_run_kb(res: dict) -> float:
        return 1024 * (res["rss"][1] - idle) / n

    def cpu_per_1000(res: dict) -> float:
        return 100 * res["cpu"] * 1000 / n

    def p(res: dict, q: float) -> float:
        return percentile(res["lags"], q) if res["lags"] else math.nan

    rows = [
        ("points/s read", f"{single['read']:,.0f}", f"{jobs['read']:,.0f}",
         jobs["read"] / single["read"]),
        ("daemon CPU, % of a core", f"{100 * single['cpu']:.1f}", f"{100 * jobs['cpu']:.1f}",
         jobs["cpu"] / single["cpu"]),
        ("  per 1,000 runs / ranks", f"{cpu_per_1000(single):.2f}", f"{cpu_per_1000(jobs):.2f}",
         jobs["cpu"] / single["cpu"]),
        ("  / the writers' own CPU", f"{single['cpu'] / single['gen_cpu']:.2f}x",
         f"{jobs['cpu'] / jobs['gen_cpu']:.2f}x",
         (jobs["cpu"] / jobs["gen_cpu"]) / (single["cpu"] / single["gen_cpu"])),
        ("writers' CPU, % of a core", f"{100 * single['gen_cpu']:.1f}",
         f"{100 * jobs['gen_cpu']:.1f}", jobs["gen_cpu"] / single["gen_cpu"]),
        ("RSS at the start, MB", f"{single['rss'][0]:.0f}", f"{jobs['rss'][0]:.0f}",
         jobs["rss"][0] / single["rss"][0]),
        ("RSS at the end, MB", f"{single['rss'][1]:.0f}", f"{jobs['rss'][1]:.0f}",
         jobs["rss"][1] / single["rss"][1]),
        (f"  per run / rank, kB (over {idle:.0f} MB idle)", f"{per_run_kb(single):.1f}",
         f"{per_run_kb(jobs):.1f}", per_run_kb(jobs) / per_run_kb(single)),
        ("lag p50, ms", f"{1000 * p(single, 0.5):.0f}", f"{1000 * p(jobs, 0.5):.0f}",
         p(jobs, 0.5) / p(single, 0.5)),
        ("lag p95, ms", f"{1000 * p(single, 0.95):.0f}", f"{1000 * p(jobs, 0.95):.0f}",
         p(jobs, 0.95) / p(single, 0.95)),
        ("lag p99, ms", f"{1000 * p(single, 0.99):.0f}", f"{1000 * p(jobs, 0.99):.0f}",
         p(jobs, 0.99) / p(single, 0.99)),
        *([("history read, s", f"{single['prefill_s']:.0f}", f"{jobs['prefill_s']:.0f}",
            jobs["prefill_s"] / single["prefill_s"])] if single["prefill_s"] > 0 else []),
        ("/metrics scrape, MB", f"{single['scrape']['bytes'] / 1e6:.2f}",
         f"{jobs['scrape']['bytes'] / 1e6:.2f}",
         jobs["scrape"]["bytes"] / single["scrape"]["bytes"]),
        ("  its daemon CPU, ms", f"{1000 * single['scrape']['cpu']:.0f}",
         f"{1000 * jobs['scrape']['cpu']:.0f}",
         jobs["scrape"]["cpu"] / max(single["scrape"]["cpu"], 1e-3)),
    ]  # fmt: skip
    label = f"{n // jobs['ranks']} jobs x {jobs['ranks']} ranks"
    width = max(len(r[0]) for r in rows)
    print(f"\n{'':{width}}  {f'{n} runs':>12}  {label:>18}  ranks / single")
    for name, a, b, ratio in rows:
        print(f"{name:{width}}  {a:>12}  {b:>18}  {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tags", type=int, default=20)
    ap.add_argument("--tick", type=float, default=1.0, help="seconds between points of a series")
    ap.add_argument("--tb-share", type=float, default=0.2, help="share of runs as tfevents")
    ap.add_argument("--seconds", type=float, default=30, help="steady phase measured")
    ap.add_argument(
        "--warmup", type=float, default=10.0, help="seconds between the API up and the phase"
    )
    ap.add_argument(
        "--inject-every", type=float, default=1.0, help="seconds between NaN injections"
    )
    ap.add_argument(
        "--prefill",
        type=int,
        default=None,
        help="steps of history per run before the live phase (4000 fills every default window; "
        "with --ranks the default fills the cross-rank spreads: 4096 / N + 64 steps)",
    )
    ap.add_argument(
        "--soak",
        action="store_true",
        help="the issue's soak: 1,000 runs for 10 minutes (--runs/--seconds still apply if given)",
    )
    ap.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="N > 1: measure --runs single runs, then the same runs as jobs of N ranks "
        "(job<j>/rank_<k>.jsonl), one phase after the other, and print their ratio",
    )
    ap.add_argument(
        "--json", type=Path, help="also write the measured phase(s) to this file (bench/all.py)"
    )
    args = ap.parse_args()
    if args.soak:
        args.runs = 1000 if args.runs == ap.get_default("runs") else args.runs
        args.seconds = 600 if args.seconds == ap.get_default("seconds") else args.seconds
        args.inject_every = 2.0 if args.inject_every == 1.0 else args.inject_every

    if args.ranks <= 1:
        args.prefill = args.prefill or 0
        res = measure(args, 1, job_records=False, tb_share=args.tb_share)
        res.update(tags=args.tags, tick=args.tick)
        report(res, args.tb_share)
        if args.json:
            args.json.write_text(json.dumps(res, default=str))
        return

    # Both phases write the same records (a distributed job's, all JSONL: rank files are
    # JSONL) so that only the layout differs: the runs' own rules are the same work in
    # both, and what the ranks phase costs more is their being ranks of jobs.
    if args.runs == ap.get_default("runs") and not args.soak:
        args.runs = 800  # a quick comparison: 100 jobs x 8 ranks
    args.runs -= args.runs % args.ranks
    if args.prefill is None:
        from trainsentry.rules.ranks import MAX_SPREAD_STEPS  # steps a band is learned from

        args.prefill = MAX_SPREAD_STEPS + 64
    idle = idle_rss()
    print(
        f"comparison: {args.runs} single runs, then {args.runs // args.ranks} jobs x "
        f"{args.ranks} ranks; the same records (loss, data_time, grad_norm and "
        f"{args.tags - 3} more series) in both, all JSONL, {args.prefill} steps of history "
        f"first; an idle daemon's RSS {idle:.0f} MB",
        flush=True,
    )
    phases = {}
    for name, ranks in (("single", 1), ("ranks", args.ranks)):
        res = measure(args, ranks, job_records=True, tb_share=0.0)
        res.update(tags=args.tags, tick=args.tick)
        print()
        report(res, 0.0, label=f"[{name}] ")
        report_jobs(res)
        sys.stdout.flush()
        phases[name] = res
    compare(phases["single"], phases["ranks"], idle)
    if args.json:
        args.json.write_text(json.dumps(phases, default=str))


if __name__ == "__main__":
    main()
