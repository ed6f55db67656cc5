"""A backtest knows how runs ended from the probe's end records, as `run` does, and its
report says it: one run closed on an exception, one closed cleanly."""

from __future__ import annotations

from pathlib import Path

import torch

import trainsentry_probe
from trainsentry.backtest.replay import replay_transitions
from trainsentry.backtest.report import build_report
from trainsentry.point import ProbeMark
from trainsentry.rules.loader import load_rules
from trainsentry.rules.run_life import RunLife
from trainsentry.sources.reading import iter_points

PACK = load_rules()


def train(logdir: Path, error: BaseException | None) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = trainsentry_probe.watch(model, opt, logdir, transfer_every=1)
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    probe.close(error)


def test_a_replay_crashes_the_run_whose_end_record_says_exception(tmp_path: Path) -> None:
    train(tmp_path / "runs" / "raised", RuntimeError("the data shard went missing"))
    train(tmp_path / "runs" / "clean", None)
    marks: list[ProbeMark] = []
    points = list(iter_points([tmp_path / "runs"], marks=marks))
    assert sorted((m.kind, m.exit) for m in marks) == [
        ("end", "clean"), ("end", "exception"), ("meta", ""), ("meta", ""),
    ]  # fmt: skip
    lives: dict[str, RunLife] = {}
    out = replay_transitions(points, PACK, order="input", marks=marks, lives=lives)
    [page] = [t for t in out if t.state == "firing"]
    assert (page.run, page.rule) == ("runs/raised", "probe_ended_by_exception")
    assert "RuntimeError: the data shard went missing" in page.message
    assert (lives["runs/raised"].state, lives["runs/raised"].cause) == (
        "crashed", "RuntimeError: the data shard went missing",
    )  # fmt: skip
    assert lives["runs/clean"].state == "finished"
    report = build_report(points, PACK, order="input", marks=marks)
    assert "crashed: RuntimeError: the data shard went missing" in report
    assert "; finished" in report
