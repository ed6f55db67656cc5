"""Every bench under bench/ starts: its imports still name what the daemon has.

Benches are run by hand, seldom, and nothing else imports them, so a module moved
in the daemon broke `bench/detection.py` unnoticed. `--help` imports a bench whole
and runs nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

# the scripts (the rest are their shared modules); report_screenshot.py drives a
# headless Chromium, which it looks for before parsing its flags
BENCHES = sorted(
    p
    for p in (REPO / "bench").glob("*.py")
    if '__name__ == "__main__"' in p.read_text() and p.name != "report_screenshot.py"
)


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_the_bench_imports_and_shows_its_help(bench: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(bench), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
