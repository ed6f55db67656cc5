"""Generate the fault-injection corpus: small real training runs with labels.

    python bench/corpus.py [--out bench/.cache/corpus] [--quick] [--jobs N] [--only SUBSTR]
                           [--shapes | --no-shapes] [--force]

Each run trains a small torch model on the CPU (fixed seeds, one thread) and
logs through a real writer (torch / tensorboardX SummaryWriter, Lightning's
CSV and TensorBoard loggers, JSONL, Keras-style split directories); its
directory gets a `label.json` with the ground truth. Runs are independent, so
they are spread over worker processes. See corpusgen/plan.py for what the
corpus holds and why.

The framework shapes (corpusgen/shapes/) go to OUT/frameworks/: runs trained
through the HF Trainer, Lightning, Keras `fit`, a TF2-style writer and
tensorboardX with each framework's default logging. `--shapes` makes only
those, `--no-shapes` only the classic corpus. A shape run whose label.json
holds the same spec and code version is kept (`--force` retrains it): the
frameworks take minutes where the classic corpus takes seconds.
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
from corpusgen.shapes.plan import build_plan as build_shapes_plan
from corpusgen.shapes.spec import ShapeRun

DEFAULT_OUT = Path(__file__).resolve().parent / ".cache" / "corpus"
SHAPES_DIR = "frameworks"
SHAPES_SOURCE = Path(__file__).resolve().parent / "corpusgen" / "shapes"


def _run_one(job: tuple[RunSpec, str, int]) -> dict[str, object]:
    """Worker entry: one thread per process, so N workers use N cores, not N×N."""
    import torch
    from corpusgen.train import train

    torch.set_num_threads(1)
    spec, out, index = job
    return train(spec, Path(out) / spec.name, index)


def _shape_worker_init() -> None:
    """One torch thread per worker; Keras on torch (no TensorFlow here); quiet libraries."""
    import warnings

    os.environ.setdefault("KERAS_BACKEND", "torch")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)


def _run_shape(job: tuple[ShapeRun, str, str]) -> dict[str, object]:
    from corpusgen.shapes.run import train

    run, out, version = job
    return train(run, Path(out) / run.name, version)


def shapes_code_version() -> str:
    """A hash of the shape sources and the framework versions: a cached run is reused
    only if it was made by the same code against the same frameworks."""
    import hashlib
    from importlib.metadata import version

    digest = hashlib.sha256()
    for path in sorted(SHAPES_SOURCE.glob("*.py")):
        digest.update(path.read_bytes())
    for package in ("torch", "transformers", "lightning", "keras", "tensorboard", "tensorboardX"):
        digest.update(f"{package}={version(package)}".encode())
    return digest.hexdigest()[:16]


def _cached_label(run_dir: Path, run: ShapeRun, code: str) -> dict[str, object] | None:
    from dataclasses import asdict

    path = run_dir / "label.json"
    if not path.exists():
        return None
    label = json.loads(path.read_text())
    if label.get("code_version") != code or label.get("spec") != asdict(run):
        return None
    return label


def make_shapes(args: argparse.Namespace) -> int:
    """Train the framework-shape runs that are not cached; print what the corpus holds."""
    plan = [r for r in build_shapes_plan(args.quick) if args.only in r.name]
    out = args.out / SHAPES_DIR
    out.mkdir(parents=True, exist_ok=True)
    code = shapes_code_version()
    labels: list[dict[str, object]] = []
    todo: list[ShapeRun] = []
    for run in plan:
        label = None if args.force else _cached_label(out / run.name, run, code)
        if label is None:
            todo.append(run)
        else:
            labels.append(label)
    # The long runs (HF at its default 500-step logging) first, so the pool ends together.
    todo.sort(key=lambda r: -_shape_cost(r))
    started = time.perf_counter()
    if todo:
        print(f"framework shapes: training {len(todo)} runs ({len(labels)} cached) ...", flush=True)
        with ProcessPoolExecutor(max_workers=args.jobs, initializer=_shape_worker_init) as pool:
            labels += list(pool.map(_run_shape, [(r, str(out), code) for r in todo]))
    labels.sort(key=lambda lab: str(lab["name"]))
    (out / "index.json").write_text(json.dumps(labels, indent=1) + "\n")
    _shapes_summary(labels, time.perf_counter() - started, len(todo), args.jobs)
    return 0


def _shape_cost(run: ShapeRun) -> float:
    per_step = {"hf": 2.5, "keras": 4.0, "lightning": 3.0}.get(run.spec.framework, 1.0)
    return per_step * run.steps * (1 + run.param if run.fault == "slowdown" else 1)


def _shapes_summary(
    labels: list[dict[str, object]], seconds: float, trained: int, jobs: int
) -> None:
    print(
        f"\nframework shapes: {len(labels)} runs ({trained} trained in {seconds:.0f} s wall"
        f" on {jobs} processes)"
    )
    cpu = sum(float(lab["train_seconds"]) for lab in labels)  # type: ignore[arg-type]
    print(f"train time of all runs, summed: {cpu:.0f} s")
    head = f"{'run':40} {'every':>5} {'onset':>6} {'1st pt':>6} {'crash':>6} {'pts':>4}"
    print(f"\n{head} {'best pre':>9} {'final':>9} {'×3?':>4} {'sec':>6}  note")
    for lab in labels:
        loss = lab["loss"]
        assert isinstance(loss, dict)
        best, final = loss["best_pre"], loss["final"]
        print(
            f"{lab['name']!s:40} {lab['log_every']!s:>5} {lab['onset_step']!s:>6} "
            f"{lab['first_abnormal_step']!s:>6} {lab['crash_step']!s:>6} {loss['points']!s:>4} "
            f"{_num(best):>9} {_num(final):>9} {'yes' if lab['stayed_x3'] else '':>4} "
            f"{lab['train_seconds']!s:>6}  {_shape_surprise(lab)}"
        )


def _num(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _shape_surprise(label: dict[str, object]) -> str:
    """A note when a run did not do what its kind intends (reported, not hidden)."""
    crashed = label["crash_step"] is not None
    fault = label["fault"]
    if label["healthy"] and (crashed or label["stayed_x3"]):
        return "healthy run crashed" if crashed else "healthy run ended ×3 above its best"
    if fault in ("lr_jump", "nan") and not crashed:
        return "no crash"
    if fault in ("divergence", "level_shift") and not label["stayed_x3"]:
        return "loss did not stay ×3 above its best"
    if fault == "divergence" and crashed:
        return "divergence crashed"
    return ""


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
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--shapes", action="store_true", help="only the framework-shapes runs")
    part.add_argument("--no-shapes", action="store_true", help="only the classic corpus")
    ap.add_argument("--force", action="store_true", help="retrain cached framework-shape runs")
    args = ap.parse_args(argv)
    if not args.shapes:
        make_classic(args)
    if not args.no_shapes:
        make_shapes(args)
    return 0


def make_classic(args: argparse.Namespace) -> None:
    """The classic corpus: one loop, every writer, every step logged."""
    plan = [s for s in build_plan(args.quick) if args.only in s.name]
    if not plan:
        return
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
