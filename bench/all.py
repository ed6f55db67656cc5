"""Issue 34's table in one command: every reading and load bench against its peer, same run.

Each bench runs as a subprocess (its own imports, its own peak memory) and
says its result to this script as JSON (`--json`); what is printed and written
is each ratio to a peer measured in the same run on the same machine, so that
a regression shows as a ratio, not as an absolute time on a machine that
another job happens to load. A bench that cannot run (a peer not installed,
a timeout, a crash) gives a row saying why.

    python bench/all.py --quick            # minutes: the small data sets, one fleet size
    python bench/all.py                    # the full sets, fleets of 1,000, 3,000, 10,000 runs
    python bench/all.py --quick --write    # and the table into docs/benchmarks.md

`--write` replaces the part of docs/benchmarks.md between the `bench/all.py`
markers with the table, the machine (CPU model, cores, load average at the
start) and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DOC = BENCH.parent / "docs" / "benchmarks.md"
BEGIN = "<!-- bench/all.py: begin -->"
END = "<!-- bench/all.py: end -->"


@dataclass(frozen=True)
class Row:
    work: str
    ours: str
    peer: str
    ratio: str
    target: str


@dataclass(frozen=True)
class Ran:
    """A bench's result: its JSON, or why there is none; its printed output either way."""

    found: Any
    why: str
    printed: str


def run(script: str, args: list[str], timeout: float, wants_json: bool = True) -> Ran:
    """`script` with `args` (and `--json FILE` when it writes one), its output shown as it ends."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        argv = [sys.executable, str(BENCH / script), *args]
        if wants_json:
            argv += ["--json", str(out)]
        print(f"$ {' '.join([Path(argv[1]).name, *argv[2:]])}", flush=True)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Ran(None, f"did not finish in {timeout:.0f} s", "")
        printed = done.stdout
        print("  " + printed.strip().replace("\n", "\n  "), flush=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return Ran(None, f"failed: {last[:160]}", printed)
        if not wants_json:
            return Ran(None, "", printed)
        if not out.exists():
            return Ran(None, "wrote no result", printed)
        return Ran(json.loads(out.read_text()), "", printed)


def _k(rate: float) -> str:
    return f"{rate / 1000:,.0f} k" if rate >= 1000 else f"{rate:,.0f}"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def event_rows(quick: bool, timeout: float) -> list[Row]:
    """bench/ingest.py: both encodings, per CPU-second against the Rust data server."""
    # best of 3 on the small files: the Rust server's CPU is read in 10 ms clock ticks
    ran = run("ingest.py", [*(["--quick", "--repeat", "3"] if quick else []),
                            "--readers", "trainsentry,tbparse,rustboard"], timeout)  # fmt: skip
    label = {"torch": "torch `simple_value`", "tf2": "TF2 tensor scalars"}
    if ran.found is None:
        return [Row(f"TB event file, {label[k]}", ran.why, "", "", "≥ 1.0× Rust") for k in label]
    rows = []
    for kind, got in ran.found.items():
        work = f"TB event file, {label.get(kind, kind)}, {got['points'] / 1e6:g} M points"
        readers = got["readers"]

        def per_cpu(reader: str, readers: dict[str, Any] = readers) -> float | str:
            r = readers.get(reader, "not run")
            return r if isinstance(r, str) else r["points"] / max(r["cpu_s"], 1e-9)

        ours, rust, tbparse = per_cpu("trainsentry"), per_cpu("rustboard"), per_cpu("tbparse")
        if isinstance(ours, str):
            rows.append(Row(work, ours, "", "", "≥ 1.0× Rust"))
            continue
        peers = [f"Rust data server {_k(rust)}" if not isinstance(rust, str) else
                 f"Rust data server: {rust}",
                 f"tbparse {_k(tbparse)}" if not isinstance(tbparse, str) else
                 f"tbparse: {tbparse}"]  # fmt: skip
        if isinstance(rust, str):
            ratio, target = "", "≥ 1.0× Rust (no peer)"
        else:
            ratio = f"{ours / rust:.2f}× Rust"
            target = f"≥ 1.0× Rust: {_met(ours >= rust)}"
        rows.append(Row(work, f"{_k(ours)} points per CPU-s", "; ".join(peers), ratio, target))
    return rows


_TEXT_OURS = re.compile(r"^\s*trainsentry\b.*?([\d.]+) MB/s\s*$", re.M)
_TEXT_NAIVE = re.compile(r"^\s*naive\b.*?([\d.]+) MB/s\s*$", re.M)
_TEXT_SIZE = re.compile(r"^text log: ([\d,]+) MB", re.M)
# the target is per core: taken from this line where the bench prints it
_TEXT_CPU = re.compile(r"per CPU-second.*?trainsentry ([\d.]+) MB, naive ([\d.]+) MB")


def text_rows(quick: bool, timeout: float) -> list[Row]:
    """bench/ingest_text.py: MB/s against the naive loop, read from its printed lines."""
    ran = run("ingest_text.py", ["--quick"] if quick else [], timeout, wants_json=False)
    work = "job stdout, the default pack"
    target = "≥ 100 MB/s a core and ≥ 10× naive"
    if ran.why:
        return [Row(work, ran.why, "", "", target)]
    ours, naive = _TEXT_OURS.search(ran.printed), _TEXT_NAIVE.search(ran.printed)
    if ours is None or naive is None:
        return [Row(work, "its printed lines no longer say MB/s as expected", "", "", target)]
    size = _TEXT_SIZE.search(ran.printed)
    if size:
        work += f", {size.group(1)} MB"
    mine, theirs, unit = float(ours.group(1)), float(naive.group(1)), "MB/s"
    per_cpu = _TEXT_CPU.search(ran.printed)
    if per_cpu:
        mine, theirs, unit = float(per_cpu.group(1)), float(per_cpu.group(2)), "MB per CPU-s"
    ok = mine >= 100 and mine >= 10 * theirs
    return [Row(work, f"{mine:.1f} {unit}", f"naive loop, every pattern on every line: "
                f"{theirs:.1f} {unit}", f"{mine / theirs:.2f}× naive",
                f"{target}: {_met(ok)}")]  # fmt: skip


def tracker_rows(quick: bool, timeout: float) -> list[Row]:
    """bench/ingest_trackers.py: W&B's parse loop and MLflow's get_metric_history."""
    ran = run("ingest_trackers.py", ["--quick"] if quick else [], timeout)
    targets = {".wandb": ("W&B offline run", 1.0), "mlflow.db": ("MLflow store (mlflow.db)", 3.0)}
    if ran.found is None:
        return [Row(w, ran.why, "", "", f"≥ {t:g}×") for w, t in targets.values()]
    rows = []
    for name in (".wandb", "mlflow.db"):
        got = ran.found.get(name)
        work, want = targets[name]
        if got is None:
            rows.append(Row(work, "not measured", "", "", f"≥ {want:g}×"))
            continue
        ours = got["points"] / got["seconds"]
        theirs = got["peer_points"] / got["peer_seconds"]
        ratio = ours / theirs
        rows.append(Row(f"{work}, {got['points'] / 1000:,.0f} k points", f"{_k(ours)} points/s",
                        f"{got['peer']}: {_k(theirs)}/s", f"{ratio:.2f}×",
                        f"≥ {want:g}×: {_met(ratio >= want)}"))  # fmt: skip
    return rows


def load_rows(quick: bool, timeout: float) -> list[Row]:
    """bench/load.py at a few fleet sizes: the daemon's CPU against the writers' own."""
    fleets = (1000,) if quick else (1000, 3000, 10000)
    seconds = "20" if quick else "60"
    target = "10,000 runs on < 50 % of a core"
    rows = []
    for runs in fleets:
        ran = run("load.py", ["--runs", str(runs), "--seconds", seconds], timeout)
        work = f"live fleet, {runs:,} runs × 20 series"
        if ran.found is None:
            rows.append(Row(work, ran.why, "", "", target))
            continue
        got = ran.found
        cpu, gen = got["cpu"], got["gen_cpu"]
        at_10k = cpu * 10000 / runs
        lags = sorted(got["lags"])
        p99 = f", NaN lag p99 {lags[int(0.99 * (len(lags) - 1))]:.2f} s" if lags else ""
        rows.append(
            Row(
                work,
                f"{100 * cpu:.0f} % of a core, RSS {got['rss'][1]:.0f} MB{p99}",
                f"the writers' own CPU: {100 * gen:.0f} %",
                f"{cpu / gen:.2f}× the writers",
                f"{target}: {at_10k:.2f} cores at this rate, {_met(at_10k < 0.5)}",
            )
        )
    return rows


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (f"{model}, {os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / "
            f"{load[2]:.1f} at the start")  # fmt: skip


def table(rows: list[Row]) -> str:
    lines = ["| work | trainsentry | peer, same run | ratio | target |", "|---|---|---|---|---|"]
    lines += [f"| {r.work} | {r.ours} | {r.peer} | {r.ratio} | {r.target} |" for r in rows]
    return "\n".join(lines)


def write(doc: Path, section: str) -> None:
    text = doc.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no '{BEGIN}' ... '{END}' section to replace")
    doc.write_text(text[: start + len(BEGIN)] + "\n" + section + "\n" + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data sets, one fleet size")
    parser.add_argument(
        "--write", action="store_true", help=f"replace the marked table in {DOC.name}"
    )
    parser.add_argument(
        "--only",
        default="events,text,trackers,load",
        help="which benches, comma-separated (events, text, trackers, load)",
    )
    args = parser.parse_args()
    about = machine()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    timeout = 300.0 if args.quick else 3600.0
    benches: dict[str, Callable[[bool, float], list[Row]]] = {
        "events": event_rows,
        "text": text_rows,
        "trackers": tracker_rows,
        "load": load_rows,
    }
    rows: list[Row] = []
    for name in args.only.split(","):
        if name not in benches:
            raise SystemExit(f"--only: no bench named {name!r} (one of {', '.join(benches)})")
        rows += benches[name](args.quick, timeout)
    section = (f"Measured by `python bench/all.py{' --quick' if args.quick else ''}` "
               f"on {started}: {about}.\n\n{table(rows)}")  # fmt: skip
    print()
    print(section)
    if args.write:
        write(DOC, section)
        print(f"\nwritten to {DOC}")


if __name__ == "__main__":
    main()
