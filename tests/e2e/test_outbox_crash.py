"""The real daemon, killed with SIGKILL while it delivers, restarted: nothing lost, nothing
confirmed sent twice. And an endpoint that hangs delays only its own notifications."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from support.loss_log import RULES, delivered, write_chunk
from support.notify_endpoints import HttpReceiver, Request
from support.state_db import confirmed

SECRET = "s3cr3t-t0ken-9f8e7d"


def start_daemon(tmp: Path, *notify: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "trainsentry", "run", str(tmp / "logs"), "-v"]
    args += ["--state-dir", str(tmp / "state"), "--rules", str(tmp / "rules.yaml")]
    args += ["--alerts-jsonl", str(tmp / "alerts.jsonl"), "--group-interval", "0"]
    for url in notify:
        args += ["--notify", url]
    log = (tmp / "daemon.log").open("ab")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def test_kill_9_during_delivery_loses_nothing_and_repeats_nothing_confirmed(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    run = tmp_path / "logs" / "exp1"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    receiver = HttpReceiver()
    url = f"json://{receiver.url}/hook"
    expected: set[tuple[str, int]] = set()
    kills: list[tuple[int, set[tuple[str, int]]]] = []  # (requests seen, confirmed) at each kill
    daemon = start_daemon(tmp_path, url)
    try:
        for i in range(10):
            base = 10 * i
            write_chunk(log, range(base, base + 10), {base + 3, base + 6})
            expected |= {("firing", base + 3), ("resolved", base + 4)}
            expected |= {("firing", base + 6), ("resolved", base + 7)}
            if i % 2:  # kill while the receiver holds a request: it was never confirmed
                receiver.hold = True
                assert receiver.held.wait(30), (tmp_path / "daemon.log").read_text()
            else:  # kill right after a delivery of this round, at whatever the daemon does then
                seen = len(receiver.accepted())
                assert receiver.wait_for(
                    lambda reqs, n=seen: sum(r.status == 200 for r in reqs) > n
                )
            daemon.send_signal(signal.SIGKILL)
            daemon.wait()
            kills.append((len(receiver.requests), confirmed(tmp_path / "state" / "state.db")))
            receiver.hold = False
            receiver.release.set()
            receiver.held.clear()
            daemon = start_daemon(tmp_path, url)
            receiver.release.clear()

        def everything(reqs: list[Request]) -> bool:
            got = {a for r in reqs if r.status == 200 for a in delivered(r)}
            return expected <= got

        assert receiver.wait_for(everything), (tmp_path / "daemon.log").read_text()[-3000:]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        receiver.close()
    requests = list(receiver.requests)
    counts = Counter(a for r in requests for a in delivered(r))
    assert set(counts) == expected
    for seen, done in kills:  # what was confirmed at a kill never arrives again after it
        before = {a for r in requests[:seen] for a in delivered(r)}
        after = Counter(a for r in requests[seen:] for a in delivered(r))
        assert not [a for a in done & before if after[a]], "a confirmed notification was repeated"
    assert SECRET not in (tmp_path / "daemon.log").read_text()


def test_a_hanging_endpoint_delays_only_itself_and_reading_goes_on(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    run = tmp_path / "logs" / "exp1"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    hanging, healthy = HttpReceiver(), HttpReceiver()
    hanging.hold = True
    daemon = start_daemon(
        tmp_path, f"json://{hanging.url}/{SECRET}", f"json://{healthy.url}/?token={SECRET}"
    )
    try:
        write_chunk(log, range(0, 5), {2})
        assert hanging.held.wait(30)
        for i in range(1, 4):  # while one endpoint hangs, points are read and alerts evaluated
            write_chunk(log, range(10 * i, 10 * i + 5), {10 * i + 2})
            assert healthy.wait_for(
                lambda reqs, s=10 * i + 2: any(("firing", s) in delivered(r) for r in reqs)
            )
        jsonl = (tmp_path / "alerts.jsonl").read_text().splitlines()
        assert sum(json.loads(line)["state"] == "firing" for line in jsonl) == 4
        hanging.hold = False
        hanging.release.set()  # the endpoint comes back: the held and the queued arrive

        def all_four(reqs: list[Request]) -> bool:
            got = {a for r in reqs if r.status == 200 for a in delivered(r)}
            return {("firing", s) for s in (2, 12, 22, 32)} <= got

        assert hanging.wait_for(all_four, timeout=60), (tmp_path / "daemon.log").read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        hanging.close()
        healthy.close()
    output = (tmp_path / "daemon.log").read_text()
    assert SECRET not in output
    assert "stopped after reading" in output
    assert os.path.exists(tmp_path / "state" / "incidents" / "exp1" / "loss_high-2.json")
