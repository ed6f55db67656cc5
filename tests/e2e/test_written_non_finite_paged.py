"""A diverged loss written as loggers write it pages on the live daemon: the word `"nan"`
of a logger that writes `str(value)`, `"inf"`, and the `null` orjson and pandas write for a
NaN; the empty cells of a pandas sparse frame page nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
from support.daemon_process import DaemonProcess
from support.waiting import wait_until

NAN = float("nan")


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def firings(alerts: Path) -> list[dict[str, Any]]:
    if not alerts.exists():
        return []
    lines = alerts.read_text().splitlines()
    return [t for t in map(json.loads, lines) if t["state"] == "firing"]


def test_loss_non_finite_fires_on_the_nan_every_writer_spells_its_own_way(
    tmp_path: Path,
) -> None:
    logs, alerts = tmp_path / "logs", tmp_path / "alerts.jsonl"
    healthy = [{"step": s, "loss": 2.0 - s / 10, "lr": 0.1} for s in range(5)]
    runs = ["str_nan", "str_inf", "orjson", "pandas", "sparse"]
    for name in runs:
        (logs / name).mkdir(parents=True)
    for name in runs[:3]:
        (logs / name / "metrics.jsonl").write_bytes(
            b"".join(orjson.dumps(r) + b"\n" for r in healthy)
        )
    pd.DataFrame(healthy).to_json(logs / "pandas" / "metrics.jsonl", orient="records", lines=True)
    # HF's log_history through pandas: eval rows hold `loss: null`, train rows `eval_loss: null`
    hf = [
        {"loss": 2.0, "grad_norm": 1.0, "step": 10},
        {"eval_loss": 1.9, "eval_runtime": 3.0, "step": 10},
        {"loss": 1.8, "grad_norm": 1.0, "step": 20},
        {"eval_loss": 1.7, "eval_runtime": 3.0, "step": 20},
    ]
    pd.DataFrame(hf).to_json(logs / "sparse" / "metrics.jsonl", orient="records", lines=True)

    daemon = DaemonProcess(
        str(logs), "--state-dir", str(tmp_path / "state"), "--history", "all",
        "--http", "off", "--alerts-jsonl", str(alerts), merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        assert firings(alerts) == []  # the eval rows' nulls of the sparse frame paged nothing
        append(
            logs / "str_nan" / "metrics.jsonl",
            (json.dumps({"step": 5, "loss": str(NAN)}) + "\n").encode(),
        )
        append(
            logs / "str_inf" / "metrics.jsonl", b'{"step": 5, "loss": "Infinity", "lr": "0.1"}\n'
        )
        append(
            logs / "orjson" / "metrics.jsonl",
            orjson.dumps({"step": 5, "loss": NAN, "lr": 0.1}) + b"\n",
        )
        pandas_nan = pd.DataFrame([{"step": 5, "loss": NAN, "lr": 0.1}])
        append(
            logs / "pandas" / "metrics.jsonl",
            pandas_nan.to_json(orient="records", lines=True).encode(),
        )
        # more of the sparse frame's kinds of row, then a training row whose loss is a NaN
        more = [*hf, {"loss": NAN, "grad_norm": 1.0, "step": 30}]
        sparse_text = pd.DataFrame(more).to_json(orient="records", lines=True)
        append(logs / "sparse" / "metrics.jsonl", sparse_text.encode().split(b"\n", 4)[4])
        wait_until(
            lambda: (
                {t["run"] for t in firings(alerts) if t["rule"] == "loss_non_finite"} >= set(runs)
            ),
            "loss_non_finite firing on every run",
        )
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, "".join(daemon.lines[-20:])
    paged = {(t["run"], t["step"]) for t in firings(alerts) if t["rule"] == "loss_non_finite"}
    assert paged == {(run, 5) for run in runs[:4]} | {("sparse", 30)}
