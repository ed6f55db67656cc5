"""The real daemon when a run directory is deleted under it while an alert fires on it."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from support.daemon_process import DaemonProcess
from support.loss_log import RULES, delivered, write_chunk
from support.notify_endpoints import HttpReceiver
from support.ports import free_port
from support.waiting import wait_until


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def test_a_deleted_run_is_released_its_alerts_resolve_and_the_daemon_goes_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    root = tmp_path / "logs"
    doomed, kept = root / "doomed", root / "kept"
    doomed.mkdir(parents=True)
    kept.mkdir()
    alerts = tmp_path / "alerts.jsonl"
    receiver = HttpReceiver()
    port = free_port()
    daemon = DaemonProcess(
        str(root),
        "--state-dir", str(tmp_path / "state"),
        "--rules", str(tmp_path / "rules.yaml"),
        "--alerts-jsonl", str(alerts),
        "--notify", f"json://{receiver.url}/hook",
        "--http", f"127.0.0.1:{port}",
        merge_stderr=True,
    )  # fmt: skip
    try:
        write_chunk(doomed / "metrics.jsonl", range(0, 10), {9})  # still firing at its last step
        write_chunk(kept / "metrics.jsonl", range(0, 10), set())
        assert receiver.wait_for(lambda reqs: any(("firing", 9) in delivered(r) for r in reqs))
        wait_until(lambda: len(api(port, "/api/runs")["runs"]) == 2, "both runs listed")

        shutil.rmtree(doomed)
        daemon.wait_for_text("resolved (run deleted)")
        assert receiver.wait_for(lambda reqs: any(("resolved", 9) in delivered(r) for r in reqs))
        wait_until(
            lambda: [r["run"] for r in api(port, "/api/runs")["runs"]] == ["kept"],
            "the deleted run is forgotten",
        )
        assert api(port, "/api/alerts")["alerts"] == []

        write_chunk(kept / "metrics.jsonl", range(10, 20), {15})  # the daemon goes on
        assert receiver.wait_for(lambda reqs: any(("firing", 15) in delivered(r) for r in reqs))
    finally:
        daemon.stop()
        receiver.close()
    daemon.clean_output()
    resolved = [json.loads(line) for line in alerts.read_text().splitlines()]
    resolved = [a for a in resolved if a["run"] == "doomed" and a["state"] == "resolved"]
    assert [a["reason"] for a in resolved] == ["run deleted"]
