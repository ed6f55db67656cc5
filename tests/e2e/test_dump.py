"""`trainsentry dump` prints exactly what the real writers wrote, as tbparse reads it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

VALUES = [1.5, 0.25, float("nan"), float("inf"), -2.0, 1e-8, 3.0]


def dump(*paths: Path, fmt: str = "jsonl") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", "dump", *map(str, paths), "--format", fmt],
        capture_output=True,
        text=True,
        check=True,
    )


def dumped(*paths: Path) -> list[dict]:
    return [json.loads(line) for line in dump(*paths).stdout.splitlines()]


def key(tag: str, step: int, value: float) -> tuple[str, int, str]:
    return (tag, int(step), "nan" if math.isnan(value) else repr(float(value)))


def tbparse_scalars(logdir: Path) -> list[tuple[str, int, str]]:
    from tbparse import SummaryReader

    df = SummaryReader(str(logdir), pivot=False).scalars
    return sorted(key(r.tag, r.step, r.value) for r in df.itertuples())


def write_torch(logdir: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(logdir)) as w:
        for step, v in enumerate(VALUES):
            w.add_scalar("train/loss", v, step)
            w.add_scalar("Gradient/Norm", abs(v) * 2, step)


def write_tbx(logdir: Path) -> None:
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(logdir)) as w:
        for step, v in enumerate(VALUES):
            w.add_scalar("loss", v, step)


@pytest.mark.parametrize("writer", [write_torch, write_tbx])
def test_dump_equals_tbparse_for_real_writers(tmp_path: Path, writer) -> None:
    run = tmp_path / "run1"
    writer(run)
    ours = sorted(key(p["tag"], p["step"], p["value"]) for p in dumped(run))
    assert ours == tbparse_scalars(run)
    assert {p["run"] for p in dumped(run)} == {"run1"}


def test_every_event_file_of_a_run_is_followed(tmp_path: Path) -> None:
    """A restarted writer adds a second file; data appended to the first still counts."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    first = SummaryWriter(str(run), filename_suffix=".a")
    first.add_scalar("loss", 1.0, 0)
    first.flush()
    second = SummaryWriter(str(run), filename_suffix=".b")
    second.add_scalar("loss", 0.5, 10)
    second.close()
    first.add_scalar("loss", 0.9, 1)  # appended to the older file after the newer exists
    first.close()
    steps = sorted(p["step"] for p in dumped(run))
    assert steps == [0, 1, 10]


def test_keras_split_directories_fold_into_their_run(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    for split, v in (("train", 1.0), ("validation", 2.0)):
        with SummaryWriter(str(tmp_path / "fit" / split)) as w:
            w.add_scalar("epoch_loss", v, 0)
    got = {(p["run"], p["tag"]) for p in dumped(tmp_path / "fit")}
    assert got == {("fit", "train/epoch_loss"), ("fit", "validation/epoch_loss")}


def test_dump_csv_format_has_a_header_and_one_row_per_point(tmp_path: Path) -> None:
    write_tbx(tmp_path / "r")
    rows = dump(tmp_path / "r", fmt="csv").stdout.splitlines()
    assert rows[0] == "run,tag,step,wall_time,value"
    assert len(rows) == 1 + len(VALUES)


def test_run_ids_are_relative_to_the_parent_of_the_path_given(tmp_path: Path) -> None:
    for name in ("exp1/seed0", "exp1/seed1"):
        (tmp_path / "logs" / name).mkdir(parents=True)
        (tmp_path / "logs" / name / "m.jsonl").write_text('{"step": 0, "loss": 1}\n')
    assert {p["run"] for p in dumped(tmp_path / "logs")} == {"logs/exp1/seed0", "logs/exp1/seed1"}
    assert {p["run"] for p in dumped(tmp_path / "logs" / "exp1" / "seed0")} == {"seed0"}


def test_corrupt_record_is_skipped_reported_and_the_rest_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_tbx(run)
    [path] = list(run.iterdir())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    out = dump(run)
    assert 1 <= len(out.stdout.splitlines()) < len(VALUES)
    assert f"{path}:" in out.stderr and "skipped" in out.stderr
