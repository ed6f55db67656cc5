"""tests/support/dist_train.py under a real torchrun: 2 gloo ranks on the CPU, 20 healthy steps.

The end-to-end tests that watch distributed jobs launch this script; this
checks only that it runs and that every rank's stdout.log (torchrun's
`--redirects 3` layout: LOGDIR/<run_id>_<random>/attempt_0/<local_rank>/)
holds one JSON line per step and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "dist_train.py"
STEPS = 20


@pytest.mark.timeout(90)
def test_two_ranks_print_one_json_line_per_step(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--log-dir",
        str(logs),
        "--redirects",
        "3",
        str(SCRIPT),
        "--steps",
        str(STEPS),
        "--pg-timeout",
        "60",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=75)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # --redirects 3: the ranks' output goes to the files only

    outs = sorted(logs.glob("*/attempt_0/*/stdout.log"))
    assert [p.parent.name for p in outs] == ["0", "1"]
    ranks = set()
    for out in outs:
        lines = out.read_text().splitlines()
        assert len(lines) == STEPS, lines
        records = [json.loads(line) for line in lines]
        assert [r["step"] for r in records] == list(range(STEPS))
        assert all(
            set(r) == {"step", "rank", "loss", "data_time", "step_time", "time"} for r in records
        )
        times = [r["time"] for r in records]
        assert times == sorted(times)
        ranks.add(records[0]["rank"])
    assert ranks == {0, 1}
