"""Render a backtest report in headless Chromium and save a screenshot.

The report's promise is that it opens anywhere with no network; a parser
can check the markup, but only a browser shows whether the plots render and
the tables read. This writes three runs with tensorboardX (one divergence,
one divergence in a run whose directory name is HTML, one healthy), builds
the report with --compare-rules against a one-rule pack, and points Debian's
chromium at it with networking features off.

    python bench/report_screenshot.py [OUT.png]     # default: report_screenshot.png
    (apt-get install -y chromium if /usr/bin/chromium is missing)
"""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trainsentry.backtest.report import build_report, write_report
from trainsentry.rules.loader import load_rules
from trainsentry.sources.reading import iter_points

PACK_B = """rules:
  - name: grad_norm_above_50
    metric: grad_norm
    severity: critical
    threshold:
      above: 50
"""


def write_run(logdir: Path, steps: int, diverge: int | None, seed: int) -> None:
    """Loss decays, grad norm wanders near 1; from `diverge` both grow geometrically to NaN."""
    from tensorboardX import SummaryWriter

    rnd = random.Random(seed)
    writer = SummaryWriter(str(logdir))
    for step in range(steps):
        grad = 1.0 + 0.1 * rnd.random()
        loss = 2.0 * math.exp(-step / 300) + 0.05 * rnd.random()
        if diverge is not None and step >= diverge:
            grad *= 1.12 ** (step - diverge)
            loss *= 1.05 ** (step - diverge)
            if step >= diverge + 60:
                grad = loss = math.nan
            if step >= diverge + 65:
                break
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/grad_norm", grad, step)
    writer.close()


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no chromium found: apt-get install -y chromium")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "report_screenshot.png").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs = root / "logs"
        write_run(logs / "run-diverged", 1000, 500, 0)
        write_run(logs / "<script>alert(1)", 600, 300, 1)
        write_run(logs / "healthy", 800, None, 2)
        (root / "b.yaml").write_text(PACK_B, encoding="utf-8")
        report = root / "report.html"
        text = build_report(
            iter_points([logs]),
            load_rules(),
            compare=load_rules([str(root / "b.yaml")]),
            compare_label="b.yaml",
            order="input",
        )
        write_report(report, text)
        profile = root / "profile"
        cmd = [chromium(), "--headless", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               f"--user-data-dir={profile}", f"--screenshot={out}",
               "--window-size=1400,2000", "--hide-scrollbars", report.as_uri()]  # fmt: skip
        if os.geteuid() == 0:
            cmd.insert(2, "--no-sandbox")
        subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    print(f"report: {len(text):,} bytes; screenshot: {out}")


if __name__ == "__main__":
    main()
