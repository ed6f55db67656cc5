"""kill -9 at random moments while a job writes: no point skipped, repeats bounded.

The daemon commits read offsets after each cycle's points are delivered, so a
kill can repeat at most what was delivered since the last commit, and can
never skip anything. Twenty kills at random moments of a live run, twenty
restarts on the same state dir, then a clean stop: every point must have been
printed, each life must print a contiguous, in-order stretch per series, and
each restart must resume at or after where the previous life resumed (the
committed offset never goes backwards), so it repeats only what that life
printed and did not commit.

Disk-full on the state dir is not simulated here: RLIMIT_FSIZE on the child
would cut its stdout and log files too (they are files under pytest's capture),
making failures look like data loss; it needs a small loop-mounted filesystem,
which needs root.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from support.daemon_process import DaemonProcess

N = 4000
TAGS = ("loss", "grad_norm")
KILLS = 20

WRITER = """
import json, sys, time
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "a") as f:
    for step in range(n):
        f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1), "grad_norm": step}) + "\\n")
        f.flush()
        time.sleep(0.0015)
"""


def life(root: Path, state: Path) -> DaemonProcess:
    """One `trainsentry run -vv` process on the shared state dir."""
    return DaemonProcess(str(root), "-vv", "--http", "off", "--state-dir", str(state))


def printed(points: list[dict]) -> list[tuple[str, int]]:
    return [(p["tag"], p["step"]) for p in points]


def stretches(points: list[tuple[str, int]]) -> dict[str, list[int]]:
    by_tag: dict[str, list[int]] = {}
    for tag, step in points:
        by_tag.setdefault(tag, []).append(step)
    return by_tag


def test_random_kills_during_a_live_run_skip_nothing_and_repeat_only_uncommitted(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("TRAINSENTRY_CRASH_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    root, state = tmp_path / "logs", tmp_path / "state"
    (root / "job").mkdir(parents=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root / "job" / "metrics.jsonl"), str(N)]
    )
    lives: list[list[tuple[str, int]]] = []
    try:
        for _ in range(KILLS):
            killed = life(root, state)
            time.sleep(rng.uniform(0.2, 1.4))  # at startup, mid-backfill or live
            lives.append(printed(killed.stop(signal.SIGKILL)))
        assert writer.wait(timeout=60) == 0
        last = life(root, state)
        seen = {p for points in lives for p in points}
        missing = {(t, s) for t in TAGS for s in range(N)} - seen
        got: set[tuple[str, int]] = set()
        looked = 0

        def complete() -> bool:  # called on every line: only look at the new points
            nonlocal looked
            got.update(printed(last.points[looked:]))
            looked = len(last.points)
            return missing <= got

        last.wait_until(complete)
        lives.append(printed(last.stop(signal.SIGTERM)))
    finally:
        writer.kill()
        writer.wait()

    why = f"seed {seed}, printed per life: {[len(p) for p in lives]}"
    everything = Counter(p for points in lives for p in points)
    assert set(everything) == {(t, s) for t in TAGS for s in range(N)}, why
    starts: dict[str, int] = dict.fromkeys(TAGS, 0)
    for points in lives:
        for tag, steps in stretches(points).items():
            assert steps == list(range(steps[0], steps[0] + len(steps))), why  # contiguous
            assert steps[0] >= starts[tag], why  # committed offsets never go backwards
            starts[tag] = steps[0]
    # A repeat comes only from a killed life: at most what it printed, once per kill.
    assert max(everything.values()) <= 1 + KILLS, why
    assert sum(c - 1 for c in everything.values()) <= sum(len(p) for p in lives[:-1]), why
