"""Generate the fault-injection corpus: small real training runs with labels.

    python bench/corpus.py [--out bench/.cache/corpus] [--quick] [--jobs N] [--only SUBSTR]

Each run trains a small torch model on the CPU (fixed seeds, one thread) and
logs through a real writer (torch / tensorboardX SummaryWriter, Lightning's
CSV and TensorBoard loggers, JSONL, Keras-style split directories); its
directory gets a `label.json` with the ground truth. Runs are independent, so
they are spread over worker processes. See corpusgen/plan.py for what the
corpus holds and why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpusgen.faults import RunSpec
from corpusgen.plan import build_plan

DEFAULT_OUT = Path(__file__).resolve().parent / ".cache" / "corpus"


def _run_one(job: tuple[RunSpec, str, int]) -> dict[str, object]:
    """Worker entry: one thread per process, so N workers use N cores, not N×N."""
    import torch
    from corpusgen.train import train

    torch.set_num_threads(1)
    spec, out, index = job
    return train(spec, Path(out) / spec.name, index)


def _surprises(label: dict[str, object]) -> str:
    """A note when a run did not do what its kind intends (reported, not hidden)."""
    crashed = label["crash_step"] is not None
    if label["healthy"] and crashed:
        return "healthy run crashed"
    if label["fault"] in ("lr_ramp", "nan_batch") and not crashed:
        return "no crash"
    return ""


def _summary(labels: list[dict[str, object]], seconds: float, jobs: int) -> None:
    print(f"\n{len(labels)} runs in {seconds:.0f} s wall on {jobs} processes")
    kinds = Counter(str(lab["fault"] or "healthy") for lab in labels)
    print("by kind:   " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    models = Counter(str(lab["model"]) for lab in labels)
    print("by model:  " + ", ".join(f"{k} {n}" for k, n in sorted(models.items())))
    writers = Counter(str(lab["writer"]) for lab in labels)
    print("by writer: " + ", ".join(f"{k} {n}" for k, n in sorted(writers.items())))
    crashes = [lab for lab in labels if lab["crash_step"] is not None]
    predictable = sum(1 for lab in crashes if lab["predictable"])
    print(f"crashes:   {len(crashes)} ({predictable} predictable)")
    print(f"\n{'run':42} {'writer':14} {'onset':>6} {'crash':>6} {'steps':>6} {'sec':>5}  note")
    for lab in labels:
        spec = lab["spec"]
        assert isinstance(spec, dict)
        print(
            f"{spec['name']:42} {lab['writer']!s:14} {lab['onset_step']!s:>6} "
            f"{lab['crash_step']!s:>6} {lab['steps_logged']!s:>6} {lab['train_seconds']!s:>5}  "
            f"{_surprises(lab)}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="one run per fault×model, ≤400 steps")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", default="", help="only runs whose name contains this")
    args = ap.parse_args(argv)
    plan = [s for s in build_plan(args.quick) if args.only in s.name]
    args.out.mkdir(parents=True, exist_ok=True)
    # Longest first (the transformer and ramp runs), so the pool ends together.
    order = sorted(range(len(plan)), key=lambda i: -_cost(plan[i]))
    jobs = [(plan[i], str(args.out), i) for i in order]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(_run_one, jobs))
    labels = sorted(done, key=_name)
    _update_index(args.out / "index.json", labels)
    _summary(labels, time.perf_counter() - started, args.jobs)
    return 0


def _name(label: dict[str, object]) -> str:
    spec = label["spec"]
    assert isinstance(spec, dict)
    return str(spec["name"])


def _update_index(path: Path, labels: list[dict[str, object]]) -> None:
    """index.json lists every run's label; a partial (--only) run replaces just its own."""
    old = json.loads(path.read_text()) if path.exists() else []
    fresh = {_name(lab) for lab in labels}
    merged = [lab for lab in old if _name(lab) not in fresh] + labels
    path.write_text(json.dumps(sorted(merged, key=_name), indent=1) + "\n")


def _cost(spec: RunSpec) -> float:
    """A rough relative cost, only to schedule the slow runs first."""
    per_step = {"transformer": 8.0, "lstm": 3.0, "rnn": 1.5, "cnn": 1.5}.get(spec.model, 0.3)
    return per_step * spec.steps * spec.batch / 32


if __name__ == "__main__":
    raise SystemExit(main())
