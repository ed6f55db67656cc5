"""How fast trainsentry reads a job's text log, against a naive loop over the same file.

A backfill of a large stdout log (training progress lines, library warnings,
a real torch traceback and real-format NCCL, OOM-killer and Slurm lines now
and then), measured in the same run three ways:

- trainsentry: the text source as `replay` reads it (masking, events,
  tracebacks grouped, the plain lines between them found by one RE2 pass over
  each read and passed on together) and the default pack's pattern rules
  judging every event (the rules' share printed on its own: RE2's one scan for
  every pattern);
- naive: every line read and decoded, every pattern rule's regex tried on it
  (`re.search`, compiled once), nothing grouped or masked;
- JSONL: trainsentry reading a metrics file of as many lines, so a text line's
  cost can be set beside a JSONL line's (the issue's bound: no dearer).

    python bench/ingest_text.py            # 300 MB of text
    python bench/ingest_text.py --quick    # 30 MB
    python bench/ingest_text.py --quick --profile   # where trainsentry's time goes

Files are cached under bench/.cache/ (git-ignored).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import re
import sys
import time
import traceback
from pathlib import Path

from cache import cached

LINE_TARGET = 300_000_000  # bytes of text


def _real_traceback() -> str:
    """A traceback of a real torch error, as a crashed job prints it."""
    import torch

    try:
        torch.ones(2, 3) @ torch.ones(2, 3)
    except RuntimeError:
        return traceback.format_exc()
    raise AssertionError("no error raised")


RARE = (
    "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=24812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600345 milliseconds before timing out.\n",
    "Out of memory: Killed process 41234 (python) total-vm:98765432kB, anon-rss:87654321kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:180000kB oom_score_adj:0\n",
    "slurmstepd: error: *** JOB 123456 ON node17 CANCELLED AT 2026-12-02T03:14:15 "
    "DUE TO TIME LIMIT ***\n",
)
CHATTER = (
    "WARNING:root:A parameter name that contains `beta` will be renamed internally to `bias`.\n",
    "/usr/lib/python3/site-packages/torch/nn/modules/module.py:1511: UserWarning: "
    "Using a target size that is different to the input size.\n",
    "  warnings.warn(\n",
    "INFO:trainer:Saving model checkpoint to output/checkpoint-500\n",
)


def write_text(directory: Path, size: int) -> None:
    rng = random.Random(0)
    tb = _real_traceback()
    written, step = 0, 0
    with (directory / "train.log").open("w") as f:
        while written < size:
            step += 1
            loss = 2.5 * 0.9999**step + rng.random() * 0.05
            line = (
                f"step {step:>8} | loss {loss:.4f} | lr {3e-4 * min(1, step / 2000):.3e} | "
                f"grad_norm {rng.random() * 2:.3f} | {1500 + rng.random() * 50:.1f} samples/s\n"
            )
            if step % 97 == 0:
                line += CHATTER[step // 97 % len(CHATTER)]
            if step % 50_000 == 0:
                line += RARE[step // 50_000 % len(RARE)]
            if step % 120_000 == 0:
                line += tb
            f.write(line)
            written += len(line)


def write_jsonl(directory: Path, lines: int) -> None:
    rng = random.Random(0)
    with (directory / "metrics.jsonl").open("w") as f:
        for step in range(lines):
            record = {"step": step, "loss": 2.5 * 0.9999**step + rng.random() * 0.05}
            record["lr"] = 3e-4 * min(1, step / 2000)
            record["grad_norm"] = rng.random() * 2
            f.write(json.dumps(record) + "\n")


def trainsentry_text(
    path: Path, profiler: cProfile.Profile | None = None
) -> tuple[int, int, int, float, float, float]:
    """(events, of which plain lines passed on together, alerts fired, seconds, of which the
    pattern rules', CPU seconds): the text source and the pack's pattern rules; `profiler`
    on while they run (not while the pack is loaded)."""
    from trainsentry.rules.loader import load_rules
    from trainsentry.rules.log_rules import LogEngine
    from trainsentry.sources.reading import iter_events
    from trainsentry.sources.text_scan import PLAIN

    engine = LogEngine(load_rules())
    if profiler is not None:
        profiler.enable()
    start, cpu = time.perf_counter(), time.process_time()
    events, plain, fired, rules_s = 0, 0, 0, 0.0
    batch = []
    for event in iter_events([path]):
        events += 1
        plain += event.kind == PLAIN
        batch.append(event)
        if len(batch) >= 4096:
            judged = time.perf_counter()
            fired += sum(t.state == "firing" for t in engine.feed(batch))
            rules_s += time.perf_counter() - judged
            batch = []
    judged = time.perf_counter()
    fired += sum(t.state == "firing" for t in engine.feed(batch))
    rules_s += time.perf_counter() - judged
    spent, cpu = time.perf_counter() - start, time.process_time() - cpu
    if profiler is not None:
        profiler.disable()
    return events, plain, fired, spent, rules_s, cpu


def naive_text(path: Path) -> tuple[int, int, float, float]:
    """(lines, lines some pattern matched, seconds, CPU seconds): every regex on every line."""
    from trainsentry.rules.loader import load_rules
    from trainsentry.rules.model import Pattern

    patterns = [  # a rule on structured records' levels (a regex of `.`) judges no plain line
        re.compile(r.condition.regex, re.MULTILINE)
        for r in load_rules().rules
        if isinstance(r.condition, Pattern) and not r.condition.levels
    ]
    start, cpu = time.perf_counter(), time.process_time()
    lines, hits = 0, 0
    with path.open("rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace")
            lines += 1
            if any([p.search(line) for p in patterns]):  # every regex, as the naive loop does
                hits += 1
    return lines, hits, time.perf_counter() - start, time.process_time() - cpu


def trainsentry_jsonl(path: Path) -> tuple[int, float]:
    from trainsentry.sources.reading import iter_batches

    start = time.perf_counter()
    points = sum(len(batch) for batch in iter_batches([path]))
    return points, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="print where trainsentry's time goes (cProfile)"
    )
    args = parser.parse_args()
    size = LINE_TARGET // 10 if args.quick else LINE_TARGET
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
    text_dir = cached(f"textlog-{size}", lambda d: write_text(d, size), "a text log")
    log = text_dir / "train.log"
    mb = log.stat().st_size / 1e6
    with log.open("rb") as f:
        lines = sum(1 for _ in f)
    jsonl_dir = cached(f"jsonl-{lines}", lambda d: write_jsonl(d, lines), "a JSONL log")

    if args.profile:
        import pstats

        profiler = cProfile.Profile()
        trainsentry_text(log, profiler)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    events, plain, fired, ours_s, rules_s, ours_cpu = trainsentry_text(log)
    naive_lines, hits, naive_s, naive_cpu = naive_text(log)
    points, jsonl_s = trainsentry_jsonl(jsonl_dir / "metrics.jsonl")
    print(f"text log: {mb:,.0f} MB, {lines:,} lines")
    print(
        f"  trainsentry  {events:>10,} events ({plain:,} of them plain lines passed on "
        f"together), {fired} alerts in {ours_s:6.2f} s: "
        f"{lines / ours_s:>10,.0f} lines/s, {mb / ours_s:6.1f} MB/s"
    )
    print(
        f"    of which the pattern rules {rules_s:6.2f} s: {mb / rules_s:6.1f} MB/s "
        f"({rules_s / lines * 1e6:.2f} µs a line); reading the lines into events "
        f"{ours_s - rules_s:6.2f} s: {mb / (ours_s - rules_s):6.1f} MB/s"
    )
    print(
        f"  naive        {naive_lines:>10,} lines, {hits} matched in {naive_s:6.2f} s: "
        f"{naive_lines / naive_s:>10,.0f} lines/s, {mb / naive_s:6.1f} MB/s"
    )
    print(f"  ratio        x{naive_s / ours_s:.2f} (naive time / trainsentry time)")
    print(
        f"  per CPU-second (a core, whatever else the machine runs): trainsentry "
        f"{mb / ours_cpu:.1f} MB, naive {mb / naive_cpu:.1f} MB, x{naive_cpu / ours_cpu:.2f}"
    )
    print(
        f"  targets (issue 34, per CPU-second): 100 MB a core "
        f"{'met' if mb / ours_cpu >= 100 else 'NOT met'}, "
        f"10x naive {'met' if naive_cpu / ours_cpu >= 10 else 'NOT met'}"
    )
    print(
        f"JSONL: {lines:,} lines ({points:,} points) in {jsonl_s:6.2f} s: "
        f"{lines / jsonl_s:>10,.0f} lines/s; a text line costs "
        f"{ours_s / lines * 1e6:.2f} µs, a JSONL line {jsonl_s / lines * 1e6:.2f} µs "
        f"(x{(ours_s / lines) / (jsonl_s / lines):.2f})"
    )


if __name__ == "__main__":
    main()
