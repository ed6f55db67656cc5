"""Where the daemon's CPU goes under load.py's fleet: per stage, per point (nothing asserted).

load.py measures the daemon from outside; py-spy on it is unreliable on VMs
(waits in select and in idle threads are sampled as busy). Here the same
writer process (load.py's `generate`) feeds a daemon pipeline (`Service`) run
in this process, each stage wrapped with the thread's CPU clock, so the cost
splits exactly: reading (by log kind), store, engine, silence clock, commits,
the per-cycle work. Printed as µs of one core per point read and calls per
second, with the daemon thread's total against the writers' own CPU (the
peer measured in the same run). The wrappers' clock reads (~0.6 µs a call on
a VM) make the per-record stages read a few hundredths of a µs/point high.

    python bench/stages.py --runs 1000 --seconds 60 [--minutes] [--prefill 4000] [--inject-every 2]
    python bench/stages.py --runs 1000 --seconds 30 --bare   # the total, no clocks in the way
    python bench/stages.py --runs 1000 --seconds 30 --profile  # functions by own time (cProfile)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import multiprocessing as mp
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from load import cpu_seconds, generate, inject_nan

from trainsentry import store
from trainsentry.alerts import notifier, outbox
from trainsentry.config.loader import load_config
from trainsentry.http_api import view
from trainsentry.rules import engine
from trainsentry.runtime import loop as runtime
from trainsentry.runtime import run_merge, service, silence_clock
from trainsentry.sources import tail
from trainsentry.state import db as state
from trainsentry.watching import inotify

STAGES: list[tuple[type, str]] = [
    (store.Store, "extend_rows"),
    (engine.Engine, "feed_rows"),
    (run_merge.RunMerge, "add"),
    (silence_clock.SilenceClock, "arrived"),
    (service.Service, "deliver"),
    (service.Service, "_on_cycle"),
    (view.SnapshotBoard, "refresh"),
    (runtime.Daemon, "cycle"),
    (runtime.Daemon, "_read"),
    (runtime.Daemon, "_commit"),
    (runtime.Daemon, "_snapshot"),
    (runtime.Daemon, "sweep"),
    (inotify.InotifyWatcher, "take"),
    (store.Series, "_retire"),
    (store.Store, "newest"),
    (engine.Engine, "firing"),
    (engine.Engine, "tick"),
    (notifier.Notifier, "tick"),
    (outbox.Outbox, "flush_held"),
    (state.StateDB, "save_offsets"),
    (tail.FileTail, "checkpoint"),
]


class Clocks:
    """Thread CPU seconds and calls per stage."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def wrap(self, cls: type, name: str, label: Callable[[Any], str] | None = None) -> None:
        original = getattr(cls, name)
        fixed = f"{cls.__name__}.{name}"
        clock = time.thread_time

        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(obj, *args, **kwargs)
            finally:
                key = fixed if label is None else label(obj)
                self.seconds[key] += clock() - start
                self.calls[key] += 1

        setattr(cls, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def table(self, points: int, elapsed: float, top: int | None = None) -> str:
        return "\n".join(
            f"  {k:30s} {1e6 * v / points:6.2f} µs/point  {self.calls[k] / elapsed:8.1f} calls/s"
            for k, v in self.seconds.most_common(top)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--tags", type=int, default=20)
    ap.add_argument("--tb-share", type=float, default=0.2)
    ap.add_argument("--seconds", type=float, default=60, help="measured phase")
    ap.add_argument("--minutes", action="store_true", help="also a table per minute (creep)")
    ap.add_argument("--prefill", type=int, default=0, help="steps of history per run (load.py)")
    ap.add_argument(
        "--inject-every", type=float, default=0.0, help="seconds between NaN runs (as --soak: 2)"
    )
    ap.add_argument(
        "--bare",
        action="store_true",
        help="no stage clocks: the daemon thread's total alone, without the clocks' own cost",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the measured phase (no stage clocks): functions by own time",
    )
    args = ap.parse_args()
    args.bare = args.bare or args.profile
    profiler = cProfile.Profile() if args.profile else None
    gc.set_threshold(100_000, 50, 100)  # as cli.main sets it for `trainsentry run`
    clocks = Clocks()
    collecting: dict[int, float] = {}

    def gc_clock(phase: str, info: dict[str, int]) -> None:  # the collector's own time
        if phase == "start":
            collecting[0] = time.thread_time()
        elif threading.current_thread() is threading.main_thread():
            key = f"gc generation {info['generation']}"
            clocks.seconds[key] += time.thread_time() - collecting.get(0, time.thread_time())
            clocks.calls[key] += 1

    if not args.bare:
        gc.callbacks.append(gc_clock)
        for cls, name in STAGES:
            clocks.wrap(cls, name)
        clocks.wrap(tail.FileTail, "read", lambda t: f"FileTail.read ({t.log.kind})")
    warmup = 15.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "logs"
        root.mkdir()
        catch_up = 900.0 if args.prefill else 0.0
        stop_at = time.time() + 2 + catch_up + warmup + args.seconds + 5
        gen = mp.Process(
            target=generate,
            args=(str(root), args.runs, args.tags, 1.0, args.tb_share, stop_at, args.prefill),
        )
        gen.start()
        assert gen.pid is not None
        time.sleep(2)
        (Path(tmp) / "state").mkdir()  # made by the CLI before the service locks it
        svc = service.Service(load_config(None, environ={}), [root], Path(tmp) / "state")
        daemon = svc.daemon
        daemon.start()
        while args.prefill and daemon.stats.points < args.runs * args.prefill:
            daemon.cycle(timeout=0.5)
        began = time.monotonic()
        while time.monotonic() - began < warmup:
            daemon.cycle(timeout=0.5)
        clocks.reset()
        p0, c0, g0, t0 = (
            daemon.stats.points,
            time.thread_time(),
            cpu_seconds(gen.pid),
            time.monotonic(),
        )
        minute = (t0, c0, p0)
        injected, next_inject = 0, t0
        marks = (collections.Counter(clocks.seconds), collections.Counter(clocks.calls))
        if profiler is not None:
            profiler.enable()
        while time.monotonic() - t0 < args.seconds:
            daemon.cycle(timeout=0.5)
            if args.inject_every and time.monotonic() >= next_inject:
                inject_nan(root, injected)
                injected += 1
                next_inject += args.inject_every
            if args.minutes and time.monotonic() - minute[0] >= 60:
                n = daemon.stats.points - minute[2]
                took = time.thread_time() - minute[1]
                print(f"minute: {1e6 * took / n:.2f} µs/point", file=sys.stderr)
                spent = Clocks()
                spent.seconds, spent.calls = clocks.seconds - marks[0], clocks.calls - marks[1]
                print(spent.table(n, time.monotonic() - minute[0], 16), file=sys.stderr, flush=True)
                marks = (collections.Counter(clocks.seconds), collections.Counter(clocks.calls))
                minute = (time.monotonic(), time.thread_time(), daemon.stats.points)
        if profiler is not None:
            profiler.disable()
        p1, c1, g1, t1 = (
            daemon.stats.points,
            time.thread_time(),
            cpu_seconds(gen.pid),
            time.monotonic(),
        )
        gen.terminate()
        gen.join()
        daemon.close()
    points, elapsed = p1 - p0, t1 - t0
    cpu, writers = (c1 - c0) / elapsed, (g1 - g0) / elapsed
    print(
        f"{args.runs} runs x {args.tags} series: {points / elapsed:,.0f} points/s read; daemon "
        f"thread {100 * cpu:.1f}% of a core = {1e6 * (c1 - c0) / points:.2f} µs/point, "
        f"{cpu / writers:.2f}x the writers' own {100 * writers:.1f}%",
        file=sys.stderr,
    )
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(45)
    else:
        print(clocks.table(points, elapsed), file=sys.stderr)


if __name__ == "__main__":
    main()
