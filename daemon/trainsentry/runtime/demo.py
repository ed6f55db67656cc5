"""`trainsentry demo`: a made-up training job diverges while the real daemon watches it.

A newcomer should see in under a minute what the tool is for, without a GPU,
torch or any logs of their own. So a thread plays a training job that logs
what the Hugging Face Trainer logs (train/loss, train/grad_norm,
train/learning_rate, eval/loss) as TensorBoard events, written with
tensorboard's own EventFileWriter (tensorboard is already a dependency, for
its protos). It trains healthily for a while, then a learning-rate ramp makes
the gradient norm grow exponentially until the loss overflows to NaN — the
slow-then-sudden failure trainsentry exists for. Nothing about the watching
side is simulated: the live `Daemon` tails the files and the rule `Engine`
runs the shipped pack, exactly as `trainsentry run` does.

The job's events carry a simulated clock (0.5 s per step, the pace of a
mid-sized fine-tune) so that pace rules see a steady run and lead times read
in training time; the demo itself runs about 25 times faster.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from trainsentry.alert import Transition
from trainsentry.point import Row, points_of
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules
from trainsentry.runtime.loop import Daemon
from trainsentry.sinks.masking import scheme_only
from trainsentry.state.db import StateDB
from trainsentry.terminal import render as console

SECONDS_PER_STEP = 0.5  # the simulated job's pace, stamped on its events
LOG_EVERY = 5  # HF's logging_steps, scaled down
EVAL_EVERY = 50
GROWTH_PER_STEP = 1.016  # gradient norm ×10 in ~145 steps once the LR ramp starts
HEARTBEAT_STEPS = 250
OVERFLOW = 3000.0  # the norm at which the simulated fp32 loss overflows to NaN


@dataclass
class JobReport:
    """What the job knows and the watcher does not: where it really broke."""

    run_dir: Path
    nan_step: int | None = None
    nan_wall: float | None = None
    last_step: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _scalar(tag: str, value: float, step: int, wall: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall, step=step, summary=summary)


def simulate_job(
    run_dir: Path, healthy_steps: int, delay: float, report: JobReport, seed: int = 0
) -> None:
    """Write the events of a run that trains for `healthy_steps`, then diverges to NaN."""
    rng = random.Random(seed)
    writer = EventFileWriter(str(run_dir), flush_secs=1)
    start = time.time()
    grad = 1.0
    nans = 0
    try:
        step = 0
        while nans < 3:
            wall = start + step * SECONDS_PER_STEP
            ramp = max(0, step - healthy_steps)
            lr = 2e-4 * min(1.0, (step + 10) / 100) * 1.01**ramp
            if ramp:
                grad *= GROWTH_PER_STEP
            noise = 1 + rng.gauss(0, 0.05)
            norm = grad * (1.0 + 0.3 * math.exp(-step / 200) + abs(rng.gauss(0, 0.08)))
            loss = (0.6 + 2.0 * math.exp(-step / 400)) * noise * (1 + 0.002 * (grad - 1))
            if norm > OVERFLOW:
                loss, norm = math.nan, math.inf
            if step % LOG_EVERY == 0:
                writer.add_event(_scalar("train/loss", loss, step, wall))
                writer.add_event(_scalar("train/grad_norm", norm, step, wall))
                writer.add_event(_scalar("train/learning_rate", lr, step, wall))
                if step % EVAL_EVERY == 0 and step:
                    val = loss * 1.05 if math.isfinite(loss) else loss
                    writer.add_event(_scalar("eval/loss", val, step, wall + 0.2))
                writer.flush()
                if not math.isfinite(loss):
                    nans += 1
                    if report.nan_step is None:
                        report.nan_step, report.nan_wall = step, wall
                report.last_step = step
                time.sleep(delay)
            step += 1
    except BaseException as exc:  # the watcher must not wait forever for a dead job
        report.error = exc
    finally:
        writer.close()
        report.done.set()


# HF Trainer's names, shortened so a progress line fits 80 columns
SHORT = {"learning_rate": "lr"}


class Narrator:
    """Prints each transition as it happens, and remembers the ones the summary needs."""

    def __init__(self, out: TextIO, started: float) -> None:
        self.out = out
        self.started = started
        self.console = console.console_for(out) if console.is_rich(out) else None
        self.first_warning: Transition | None = None
        self.first_critical: Transition | None = None
        self.count = 0

    def heartbeat(self, step: int, latest: dict[str, float]) -> None:
        values = "  ".join(f"{SHORT.get(k, k)} {v:.3g}" for k, v in latest.items())
        status = f"{self.count} alert(s) so far" if self.count else "no alerts yet"
        stamp = f"[{time.monotonic() - self.started:4.1f}s] "
        self.line(f"step {step:>5}  {values}  {status}", prefix=stamp)
        self.out.flush()

    def line(self, text: str, prefix: str = "") -> None:
        """`text` after `prefix`; on a terminal wrapped at words and hanging after it."""
        if self.console is not None:
            console.print_text(self.console, text, prefix)
        else:
            self.out.write(prefix + text + "\n")

    def __call__(self, transitions: list[Transition]) -> None:
        for t in transitions:
            self.count += 1
            if t.state == "firing" and t.severity == "warning" and self.first_warning is None:
                self.first_warning = t
            if t.state == "firing" and t.severity == "critical" and self.first_critical is None:
                self.first_critical = t
            elapsed = f"[{time.monotonic() - self.started:4.1f}s]"
            if self.console is not None:  # as `trainsentry run` shows it on a terminal
                self.console.print(
                    console.transition_block(
                        t, show_run=False, when=elapsed, width=self.console.width
                    )
                )
                continue
            state = "ESCALATED" if t.escalated_from else t.state.upper()
            line = (
                f"{elapsed} step {t.step:>5}  {state:<9} "
                f"{t.severity:<8} {t.rule} [{t.metric}]\n{'':>8}{t.message}"
            )
            if t.state == "firing" and t.runbook:
                line += f"\n{'':>8}runbook: {t.runbook}"
            self.out.write(line + "\n")
        self.out.flush()


def _watch(daemon: Daemon, report: JobReport) -> None:
    while not report.done.is_set():
        daemon.cycle(timeout=0.1)
    daemon.sweep()  # whatever the job's last flush left unread


def run_demo(
    *,
    out: TextIO = sys.stdout,
    fast: bool = False,
    healthy_steps: int = 1000,
    keep: Path | None = None,
    notify: list[str] | None = None,
) -> int:
    """Run the job and the watcher side by side; 0 when the story was told to its end."""
    root = keep if keep is not None else Path(tempfile.mkdtemp(prefix="trainsentry-demo-"))
    logs = root / "logs"
    run_dir = logs / "demo-finetune"
    run_dir.mkdir(parents=True, exist_ok=True)
    delay = 0.002 if fast else 0.08
    # watchdog may log "queue_events() called when the thread is inactive" when the
    # observer stops mid-event: harmless, and noise in a first impression
    logging.getLogger("watchdog").setLevel(logging.CRITICAL)
    rules = load_rules()
    engine = Engine(rules)
    started = time.monotonic()
    narrate = Narrator(out, started)

    latest: dict[str, float] = {}
    shown_step = 0

    def evaluate(run: str, rows: list[Row]) -> None:
        nonlocal shown_step
        narrate(engine.feed_rows(run, rows))
        for p in points_of(run, rows):  # a heartbeat, so the quiet healthy phase does not look hung
            latest[p.tag.rsplit("/", 1)[-1]] = p.value
            if p.step >= shown_step + HEARTBEAT_STEPS and "loss" in latest:
                shown_step = p.step - p.step % HEARTBEAT_STEPS
                narrate.heartbeat(p.step, latest)

    narrate.line(
        "trainsentry demo: a simulated fine-tune writes HF Trainer metrics as TensorBoard "
        f"events; it trains normally for {healthy_steps} steps, then a learning-rate ramp "
        f"makes it diverge. The live daemon watches it with the default pack ({len(rules)} rules)."
    )
    narrate.line(str(run_dir), prefix="  logs: ")
    narrate.line("")
    out.flush()
    report = JobReport(run_dir)
    job = threading.Thread(
        target=simulate_job, args=(run_dir, healthy_steps, delay, report), daemon=True
    )
    daemon = Daemon([logs], StateDB(root / "state.db"), [evaluate])
    try:
        daemon.start()
        job.start()
        _watch(daemon, report)
        job.join()
    finally:
        daemon.close()
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if report.error is not None:
        out.write(f"trainsentry demo: the simulated job failed: {report.error}\n")
        return 1
    _summary(out, narrate, report, notify, keep)
    return 0 if narrate.first_critical is not None else 1


def _summary(
    out: TextIO,
    narrate: Narrator,
    report: JobReport,
    notify: list[str] | None,
    keep: Path | None,
) -> None:
    line = narrate.line
    line("")
    line("what happened:")
    for label, t in (("warning ", narrate.first_warning), ("critical", narrate.first_critical)):
        if t is not None:
            line(f"{t.rule}: {t.message}", prefix=f"  {label}  step {t.step:>5}  ")
    if report.nan_step is not None:
        line(
            "train/loss is nan (the job is lost)", prefix=f"  NaN       step {report.nan_step:>5}  "
        )
    first = narrate.first_critical
    if first is not None and report.nan_step is not None and report.nan_wall is not None:
        steps = report.nan_step - first.step
        seconds = report.nan_wall - first.wall_time
        line(
            f"{steps} steps, {seconds:.0f} s of training at {SECONDS_PER_STEP} s/step"
            f" — between the first critical alert and the NaN",
            prefix="  lead time: ",
        )
    elif first is None:
        line("  no critical alert fired: the demo did not go as planned")
    if notify:
        shown = ", ".join(scheme_only(u) for u in notify)
        line(f"{shown} (the demo sends nothing)", prefix="  would notify: ")
    else:
        line(
            "nothing configured — `trainsentry run --notify URL` sends these to "
            "Slack, email, ntfy, any apprise URL (try --notify json://localhost:8080/alerts)",
            prefix="  would notify: ",
        )
    if keep is not None:
        line(f"try `trainsentry replay {keep / 'logs'}`", prefix=f"  logs kept in {keep}: ")
    out.flush()
