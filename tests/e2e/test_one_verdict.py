"""One verdict for the same data: the live daemon, fed the files in random chunks and
interleavings as jobs flush them, says what `replay` of the finished files says.

One corpus, fed twice in two interleavings to one live daemon, written by the real
writers:
- an lr ×100 jump that spikes the loss in the same step, logged through MLflow's
  SQLite store, MLflow's file store (a file per metric, whose files the daemon reads
  each at its own pace: runtime/run_merge.py), W&B offline, tensorboardX, and torch's
  SummaryWriter with train/ and validation/ writers: each tracker orders one step's
  tags its own way, and none may make `loss_spike` fire and resolve "inhibited by
  lr_jump" at once where another says nothing;
- bench/corpusgen's framework shapes with the lr ×100 (HF Trainer, Lightning with its
  TensorBoard and CSV loggers, Keras at three cadences, a TF2-style tensor writer),
  among them a real Keras `fit` with the TensorBoard callback at update_freq=10: epoch
  series at step = epoch beside batch series at step = batch, whose validation loss
  must not be paired with the batch loss (no `overfitting`, which the live daemon once
  paged on this run).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import DaemonProcess
from support.paths import REPO
from support.trackers import write_all

from trainsentry.sources.reading import iter_points

# The corpus is written by real trackers and a real Keras fit: minutes on a busy machine.
pytestmark = pytest.mark.timeout(600)

STEPS, JUMP = 400, 305
# Two interleavings of the same files, each in its own folder of the root
INTERLEAVINGS = {"one": 20261204, "two": 6}
# Files a writer appends to: fed in chunks. Anything else (MLflow's meta.yaml, an
# SQLite database, W&B's config) is copied whole before them, as a job writes it first.
APPENDED = (".jsonl", ".csv", ".wandb")


def appended(path: Path) -> bool:
    return (
        path.suffix in APPENDED
        or "tfevents" in path.name
        or (
            path.parent.name == "train" and path.parent.parent.name == "metrics"
        )  # MLflow's file store: metrics/train/loss
    )


def tensorboard_runs(base: Path) -> None:
    """The trackers' series through tensorboardX (one file) and torch's SummaryWriter
    (train/ and validation/ writers of one run, as Keras and Lightning lay them out)."""
    from tensorboardX import SummaryWriter as TbxWriter
    from torch.utils.tensorboard import SummaryWriter

    sys.path.insert(0, str(REPO / "tests" / "support"))
    from tracker_jobs import series

    rows = series(STEPS, -1, 2, JUMP)
    tbx = TbxWriter(str(base / "tbx"))
    train = SummaryWriter(str(base / "torch_split" / "train"))
    validation = SummaryWriter(str(base / "torch_split" / "validation"))
    for step, values in enumerate(rows):
        for tag, value in values.items():
            tbx.add_scalar(tag, value, step)
            train.add_scalar(tag.removeprefix("train/"), value, step)
        if step % 50 == 49:
            validation.add_scalar("loss", values["train/loss"] * 1.1, step)
    for writer in (tbx, train, validation):
        writer.close()


def framework_runs(base: Path) -> Path:
    """bench/corpusgen's framework shapes with the lr ×100 from the middle of the run on
    (the 'divergence' fault): HF Trainer at logging_steps 10, 50 and 500, Lightning at 1,
    10 and 50 with its TensorBoard and CSV loggers, Keras at every batch, every 10 and
    every epoch, a TF2-style tensor writer, tensorboardX: each with its default logging."""
    out = base / "shapes"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "corpus.py"),
            "--shapes",
            "--quick",
            "--only",
            "divergence",
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return out / "frameworks"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("written")
    stores = write_all(base / "trackers", args=(str(STEPS), "-1", str(JUMP)))
    tensorboard_runs(base / "tensorboard")
    frameworks = framework_runs(base / "made")
    corpus = base / "corpus"
    for kind, store in stores.items():
        shutil.copytree(
            store, corpus / kind, symlinks=True, ignore=shutil.ignore_patterns("expected.json")
        )
    shutil.copytree(base / "tensorboard", corpus / "tensorboard")
    # what the frameworks wrote, not the bench's labels and histories beside it
    shutil.copytree(frameworks, corpus / "frameworks", ignore=shutil.ignore_patterns("*.json"))
    # the bench's whole corpus takes minutes to train (`bench/corpus.py --quick --out D`):
    # given here, it is fed and replayed with the rest
    for extra in filter(None, os.environ.get("TRAINSENTRY_VERDICT_CORPUS", "").split(os.pathsep)):
        shutil.copytree(
            extra, corpus / "bench" / Path(extra).name, ignore=shutil.ignore_patterns("*.json")
        )
    return corpus


RUNS_AT_ONCE = 8


def feed(corpus: Path, root: Path, seed: int) -> None:
    """Copy `corpus` into `root` as jobs would write it: the files written whole first,
    then the appended ones in random chunks, a few runs at a time."""
    rng = random.Random(seed)
    files = sorted(p for p in corpus.rglob("*") if p.is_file() or p.is_symlink())
    logs = [p for p in files if appended(p) and not p.is_symlink()]
    # MLflow writes a run's meta.yaml (its status) as it starts and again as it ends
    last = [p for p in files if p.name == "meta.yaml" and "metrics" not in p.parent.name]
    for path in [p for p in files if p not in logs and p not in last]:
        whole(path, root / path.relative_to(corpus))
    for path in last:  # as MLflow's create_run writes it: running, no end yet
        started(path, root / path.relative_to(corpus))
    # a few runs at a time, each run's files side by side: a run's writers flush within
    # a second or two of each other (runtime/run_merge.py waits that long for them),
    # however many other runs the daemon follows
    runs: dict[tuple[str, ...], list[Path]] = {}
    for path in logs:
        runs.setdefault(path.relative_to(corpus).parts[:3], []).append(path)
    order = sorted(runs)
    rng.shuffle(order)
    for wave in range(0, len(order), RUNS_AT_ONCE):
        appended_together(
            corpus, root, [p for run in order[wave : wave + RUNS_AT_ONCE] for p in runs[run]], rng
        )
    for path in last:
        whole(path, root / path.relative_to(corpus))


def appended_together(corpus: Path, root: Path, logs: list[Path], rng: random.Random) -> None:
    """Jobs' files made and appended in random chunks, interleaved as writers running
    side by side flush them (each file about as far along as the others, in random
    order)."""
    for path in logs:  # each writer opens its file as the job starts (MLflow at step 0)
        target = root / path.relative_to(corpus)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    left = {path: path.read_bytes() for path in logs}
    size = {path: len(data) for path, data in left.items()}

    def behind(path: Path) -> float:
        return 1 - len(left[path]) / size[path] + rng.random() * 0.05

    while left:
        path = min(sorted(left), key=behind)
        data = left[path]
        # a flush is up to 4 kB, and at most a twentieth of its file: a file's records
        # span the run, and one chunk of a small file (a validation writer's) must not
        # carry the evaluations of the whole run before the training steps between them
        cut = rng.randint(1, max(1, min(4096, size[path] // 20)))
        target = root / path.relative_to(corpus)
        with target.open("ab") as f:
            f.write(data[:cut])
        if cut >= len(data):
            del left[path]
        else:
            left[path] = data[cut:]
        if rng.random() < 0.2:
            time.sleep(0.02)  # the daemon reads in between, whatever it finds


def started(path: Path, target: Path) -> None:
    """A run's meta.yaml as MLflow writes it when the run starts: RUNNING (1), no end."""
    lines = path.read_text().splitlines(keepends=True)
    running = [
        "status: 1\n" if line.startswith("status:") else
        "end_time: null\n" if line.startswith("end_time:") else line
        for line in lines
    ]  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_name(target.name + ".part").write_text("".join(running))
    os.replace(target.with_name(target.name + ".part"), target)


def whole(path: Path, target: Path) -> None:
    """A file written at once (renamed into place), or a symlink (W&B's latest-run)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        os.symlink(os.readlink(path), target)
        return
    shutil.copyfile(path, target.with_name(target.name + ".part"))
    os.replace(target.with_name(target.name + ".part"), target)


Verdict = tuple[Any, ...]


def verdicts(alerts: list[dict[str, Any]], strip: str = "") -> dict[str, list[Verdict]]:
    """Each run's transitions, less the "run finished" a replay ends every run with."""
    out: dict[str, list[Verdict]] = {}
    for t in alerts:
        if t.get("reason") == "run finished":
            continue
        run = t["run"].removeprefix(strip)
        key = (t["rule"], t["metric"], t["state"], t["severity"], t["step"], t.get("reason"))
        out.setdefault(run, []).append(key)
    return out


@pytest.fixture(scope="module")
def live_and_replay(
    corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, list[Verdict]], dict[str, list[Verdict]]]:
    tmp = tmp_path_factory.mktemp("live")
    root = tmp / "root"
    root.mkdir()
    alerts = tmp / "alerts.jsonl"
    total = len(INTERLEAVINGS) * sum(1 for _ in iter_points([corpus]))
    daemon = DaemonProcess(
        str(root), "--state-dir", str(tmp / "state"), "--http", "off",
        "--alerts-jsonl", str(alerts), "-vv",
    )  # fmt: skip
    try:
        daemon.wait_for_text("watching")
        for part, seed in INTERLEAVINGS.items():  # one daemon, the corpus fed twice apart
            feed(corpus, root / part, seed=seed)
        daemon.wait_until(lambda: len(daemon.points) >= total, what=f"all {total} points read")
        time.sleep(1.0)  # nothing more is coming: the last record's verdicts are out
    finally:
        daemon.stop()
    live = [json.loads(line) for line in alerts.read_text().splitlines()]
    out = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", str(root), "--format", "jsonl"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    replayed = [json.loads(line) for line in out.splitlines()]
    return verdicts(live), verdicts(replayed, strip="root/")


def per_alert(transitions: list[Verdict]) -> dict[tuple[str, str], list[Verdict]]:
    out: dict[tuple[str, str], list[Verdict]] = {}
    for verdict in transitions:
        out.setdefault((verdict[0], verdict[1]), []).append(verdict)
    return out


def test_the_live_daemon_fed_in_chunks_says_what_replay_says(
    live_and_replay: tuple[dict[str, list[Verdict]], dict[str, list[Verdict]]],
) -> None:
    live, replayed = live_and_replay
    assert len(replayed) >= 2 * 20, f"replay judged too little: {sorted(replayed)}"
    # the same transitions of each alert in the same order; alerts of several series
    # at one step (five layers' norms) may be told in any order
    differ = {
        run: {
            "live only": list((mine - theirs).elements()),
            "replay only": list((theirs - mine).elements()),
        }
        for run in sorted(set(live) | set(replayed))
        if per_alert(live.get(run, [])) != per_alert(replayed.get(run, []))
        for mine, theirs in [(Counter(live.get(run, [])), Counter(replayed.get(run, [])))]
    }
    assert not differ, json.dumps(differ, indent=1)


def test_every_tracker_pages_the_jump_and_none_shows_the_inhibited_spike(
    live_and_replay: tuple[dict[str, list[Verdict]], dict[str, list[Verdict]]],
) -> None:
    live, _ = live_and_replay
    jumped = {
        run: v
        for run, v in live.items()
        if "healthy" not in run and "/frameworks/" not in run and "/bench/" not in run
    }
    # SQLite, the file store, W&B, tensorboardX, torch: in each of the two interleavings
    assert len(jumped) == 2 * 5, sorted(live)
    for run, transitions in jumped.items():
        firing = [(rule, step) for rule, _, state, _, step, _ in transitions if state == "firing"]
        assert ("lr_jump", JUMP) in firing, (run, transitions)
        assert all(rule != "loss_spike" for rule, _ in firing), (run, transitions)
        assert all(reason != "inhibited by lr_jump" for *_, reason in transitions), run


def test_keras_validation_loss_is_not_paired_with_the_batch_loss(
    live_and_replay: tuple[dict[str, list[Verdict]], dict[str, list[Verdict]]],
) -> None:
    live, _ = live_and_replay
    keras = [v for run, v in live.items() if "keras_batch10" in run]
    assert len(keras) == 2, sorted(live)
    for transitions in keras:
        rules = {rule for rule, *_ in transitions}
        assert "lr_jump" in rules or "loss_divergence" in rules, transitions
        assert not rules & {"overfitting", "overfitting_severe"}, transitions
