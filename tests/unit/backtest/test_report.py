"""`replay --report`: a real writer's divergence becomes a self-contained, escaped HTML page."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trainsentry.cli import main

tensorboardX = pytest.importorskip("tensorboardX")

PACK_B = """rules:
  - name: grad_norm_above_50
    metric: grad_norm
    severity: critical
    threshold:
      above: 50
"""


def write_run(logdir: Path, diverge: int) -> None:
    writer = tensorboardX.SummaryWriter(str(logdir))
    for step in range(diverge + 80):  # NaN for 20 steps: past the non-finite norm's 16
        grad, loss = 1.0 + 0.05 * math.sin(step), 2.0 * math.exp(-step / 300)
        if step >= diverge:
            grad *= 1.12 ** (step - diverge)
            loss *= 1.05 ** (step - diverge)
        if step >= diverge + 60:
            grad = loss = math.nan
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/grad_norm", grad, step)
    writer.close()


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.srcs.extend(v or "" for k, v in attrs if k in ("src", "href"))


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "logs"
    write_run(root / "diverged", 200)
    write_run(root / "<script>alert(1)", 150)
    return root


def test_report_is_self_contained_and_escaped(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["replay", str(logs), "--report", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    parser = Collect()
    parser.feed(text)
    parser.close()
    assert "html" in parser.tags and "img" in parser.tags
    assert "script" not in parser.tags  # the run name did not become markup
    assert "&lt;script&gt;alert(1)" in text and "<script" not in text
    assert "logs/diverged" in text
    for rule in ("grad_norm_exponential_growth", "grad_norm_non_finite", "loss_non_finite"):
        assert rule in text
    assert all(src.startswith("data:image/png;base64,") for src in parser.srcs)
    assert len(parser.srcs) >= 4  # loss and grad_norm for each run
    assert not re.search(r"https?://", text)


def test_compare_rules_shows_what_each_pack_missed(logs: Path, tmp_path: Path) -> None:
    pack = tmp_path / "b.yaml"
    pack.write_text(PACK_B, encoding="utf-8")
    out = tmp_path / "r.html"
    assert main(["replay", str(logs), "--report", str(out), "--compare-rules", str(pack)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "Comparison" in text
    row = re.search(r'<tr class="only"><td>grad_norm_above_50</td>(.*?)</tr>', text)
    assert row and "missed" in row.group(1) and "only B" in row.group(1)
    row = re.search(r'<tr class="only"><td>grad_norm_exponential_growth</td>(.*?)</tr>', text)
    assert row and "only A" in row.group(1)
    assert "A earlier by" in text


def test_compare_rules_needs_report(logs: Path) -> None:
    assert main(["replay", str(logs), "--compare-rules", str(logs)]) != 0


def test_downsample_is_bounded_and_keeps_spikes_and_nans() -> None:
    from trainsentry.backtest.data import downsample

    points = [(s, 1.0) for s in range(100_000)]
    points[5_000] = (5_000, 1e6)
    points[7_000] = (7_000, math.nan)
    kept = downsample(points)
    assert len(kept) <= 2000
    assert (5_000, 1e6) in kept
    assert any(s == 7_000 and math.isnan(v) for s, v in kept)


def test_a_jobs_ranks_are_one_table_of_the_report(tmp_path: Path) -> None:
    """Four ranks' logs (files named with a rank) read as one job, its ranks in order."""
    job = tmp_path / "logs" / "llm"
    job.mkdir(parents=True)
    for rank in (2, 0, 3, 1):
        wait = 0.05 if rank == 2 else 0.005  # rank 2 straggles
        lines = [
            f'{{"step": {s}, "time": {1_800_000_000 + s * 0.1}, "data_time": {wait}}}\n'
            for s in range(1500)
        ]
        (job / f"rank_{rank}.jsonl").write_text("".join(lines))
    out = tmp_path / "r.html"
    assert main(["replay", str(tmp_path / "logs"), "--report", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    table = text[text.index("<h2>Job logs/llm</h2>") :]
    rows = re.findall(r"<td>(logs/llm/rank\d)</td>", table.split("</table>")[0])
    assert rows == ["logs/llm/rank0", "logs/llm/rank1", "logs/llm/rank2", "logs/llm/rank3"]
    assert "rank_straggler" in table.split("</table>")[0]
