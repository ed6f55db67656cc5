"""The probe's end record: written last at every close it can know of, saying how the
training ended, so the daemon knows a finished run from one that died."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trainsentry_probe

PROBE_FILE = "trainsentry-probe.jsonl"


def lines_of(logdir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (logdir / PROBE_FILE).read_text().splitlines()]


def train(probe_dir: Path, steps: int) -> trainsentry_probe.Probe:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = trainsentry_probe.watch(model, opt, probe_dir, transfer_every=1)
    for _ in range(steps):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return probe


def test_a_clean_close_ends_the_file_with_a_clean_end_record(tmp_path: Path) -> None:
    train(tmp_path, 3).close()
    first, *_, last = lines_of(tmp_path)
    assert last["kind"] == "end" and last["format"] == "trainsentry-probe"
    assert last["exit"] == "clean" and "error" not in last
    assert last["step"] == 2 and last["pid"] == os.getpid() == first["pid"]
    assert last["host"] == first["host"]


def test_the_meta_record_names_the_process_as_proc_knows_it(tmp_path: Path) -> None:
    train(tmp_path, 1).close()
    meta = lines_of(tmp_path)[0]
    with open("/proc/self/stat", "rb") as stat:
        started = int(stat.read().rsplit(b")", 1)[1].split()[19])
    assert meta["pid_start"] == started
    assert meta["pid_ns"] == os.readlink("/proc/self/ns/pid")


def test_an_exception_out_of_the_with_block_is_said_with_its_first_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), train(tmp_path, 2):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")
    last = lines_of(tmp_path)[-1]
    assert last["exit"] == "exception"
    assert last["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_sys_exit_0_is_a_clean_end_and_another_code_is_not(tmp_path: Path) -> None:
    with pytest.raises(SystemExit), train(tmp_path / "a", 1):
        sys.exit(0)
    assert lines_of(tmp_path / "a")[-1]["exit"] == "clean"
    with pytest.raises(SystemExit), train(tmp_path / "b", 1):
        sys.exit(3)
    assert lines_of(tmp_path / "b")[-1]["exit"] == "exception"


JOB = """
import sys, torch, trainsentry_probe
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
probe = trainsentry_probe.watch(model, opt, sys.argv[1])
model(torch.randn(8, 4)).sum().backward(); opt.step()
if sys.argv[2] == "raise":
    raise ValueError("labels out of range")
"""


@pytest.mark.parametrize("how", ["raise", "return"])
def test_at_interpreter_exit_an_uncaught_exception_is_told_from_a_plain_end(
    tmp_path: Path, how: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp_path), how], capture_output=True, timeout=120
    )
    assert done.returncode == (1 if how == "raise" else 0), done.stderr
    last = lines_of(tmp_path)[-1]
    assert last["kind"] == "end"
    if how == "raise":
        assert (last["exit"], last["error"]) == ("exception", "ValueError: labels out of range")
    else:
        assert last["exit"] == "clean"
