"""One framework-shape run: train it through its framework, then write its label.

label.json holds what the benchmark scores against (bench/detection.py's
framework-shapes section): the shape, its logging interval and, for Keras,
its epoch axis; the fault, its onset (the first abnormal step) and the first
logged point at or after it; the measured crash; the pre-fault best of the
logged training and validation loss and their final values, so "the loss
stayed ×3 above its best" is decided on what the user's log shows.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from corpusgen.shapes import readback, task
from corpusgen.shapes.spec import ShapeRun, on_epoch_axis

# A fault whose loss ends this many times above its pre-fault best has not recovered.
STAYED_ABOVE = 3.0


def train(run: ShapeRun, run_dir: Path, code_version: str) -> dict[str, object]:
    """Train `run` into `run_dir` (replaced if present); write and return its label."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    monitor = task.Monitor(run)
    framework = run.spec.framework
    started = time.perf_counter()
    if framework == "hf":
        from corpusgen.shapes import hf_trainer as module
    elif framework == "lightning":
        from corpusgen.shapes import lightning_fit as module  # type: ignore[no-redef]
    elif framework == "keras":
        from corpusgen.shapes import keras_fit as module  # type: ignore[no-redef]
    else:
        from corpusgen.shapes import loops as module  # type: ignore[no-redef]
    layout = module.train(run, run_dir, monitor)
    seconds = time.perf_counter() - started
    label = _label(run, run_dir, monitor, layout, seconds, code_version)
    (run_dir / "label.json").write_text(json.dumps(label, indent=1) + "\n")
    history = {"loss": monitor.losses, "slow_base": monitor.slow_base}
    (run_dir / "history.json").write_text(json.dumps(history) + "\n")
    return label


def _window(n: int) -> int:
    """Points per level estimate: a tenth of the series and at least 5, so single-batch
    losses average out (Lightning's every-10-step log of batch-8 losses swings ×100
    around a fitted level: 5 of its 150 points put healthy runs ×40 above their best);
    fewer for short series (HF at 500 logs ~7 before onset)."""
    return max(1, min(n // 4, max(5, n // 10)))


def _stat(points: list[tuple[int, float]], before: int | None) -> dict[str, object]:
    """The series' level before `before` at its best, and at the end.

    Levels are medians of a few consecutive logged points: the minimum of
    single noisy points (one lucky batch logged every step) would put every
    healthy run ×3 above its "best".
    """
    values = [v for _, v in points]
    pre = [v for s, v in points if before is None or s < before]
    w = _window(len(values))
    tail = values[-w:]
    final = statistics.median(tail) if all(math.isfinite(v) for v in tail) else math.nan
    levels = [statistics.median(pre[i : i + w]) for i in range(len(pre) - w + 1)]
    levels = [v for v in levels if math.isfinite(v)]
    return {
        "best_pre": min(levels) if levels else None,
        "final": final if values else None,
        "last": values[-1] if values else None,
        "min_pre_point": min((v for v in pre if math.isfinite(v)), default=None),
        "points": len(points),
        "level_window": w,
    }


def _label(
    run: ShapeRun,
    run_dir: Path,
    monitor: task.Monitor,
    layout: dict[str, object],
    seconds: float,
    code_version: str,
) -> dict[str, object]:
    shape = run.spec
    series = readback.read_series(run_dir)
    roles = layout["series"]
    assert isinstance(roles, dict)
    epoch_axis = layout.get("epoch_axis")
    steps_per_epoch = shape.steps_per_epoch

    def on_train_axis(role: str) -> list[tuple[int, float]]:
        where = roles.get(role)
        if not where:
            return []
        points = series.get((where[0], where[1]), [])
        if not on_epoch_axis(epoch_axis, where[0], where[1]):
            return points
        return [((s + 1) * steps_per_epoch, v) for s, v in points]

    loss_steps, val_steps = on_train_axis("loss"), on_train_axis("val_loss")
    onset = run.onset
    first_abnormal = next((s for s, _ in loss_steps if onset is not None and s >= onset), None)
    lstat, vstat = _stat(loss_steps, onset), _stat(val_steps, onset)
    best, final = lstat["best_pre"], lstat["final"]
    stayed = (
        isinstance(best, float)
        and isinstance(final, float)
        and (not math.isfinite(final) or final >= STAYED_ABOVE * best)
    )
    return {
        "name": run.name,
        "shape": run.shape,
        "framework": shape.framework,
        "framework_version": layout["framework_version"],
        "writer": f"shape:{run.shape}",
        "healthy": run.fault is None,
        "trap": run.trap,
        "fault": run.fault,
        "seed": run.seed,
        "log_every": shape.log_every,
        "eval_every": shape.eval_every,
        "step_base": shape.step_base,
        "steps_per_epoch": shape.steps_per_epoch or None,
        "update_freq": shape.update_freq if shape.framework == "keras" else None,
        "epoch_axis": epoch_axis,
        "series": roles,
        "onset_step": onset,
        "first_abnormal_step": first_abnormal,
        "crash_step": monitor.crash_step,
        "steps_run": len(monitor.losses),
        "loss": lstat,
        "val_loss": vstat,
        "stayed_x3": stayed,
        "first_loss": monitor.losses[0][1] if monitor.losses else None,
        "slow_base_s": monitor.slow_base,
        "train_seconds": round(seconds, 2),
        "code_version": code_version,
        "spec": asdict(run),
    }
