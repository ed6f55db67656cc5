"""Write-to-receipt latency: from a flushed NaN to its notification at a local webhook.

The whole path a page takes — the watcher's event, the read, the rule, the
outbox row, the delivery worker, apprise's json:// POST — timed end to end
against a real `trainsentry run` in a subprocess. Each trial appends a NaN
loss to a live JSONL log and waits for the critical at a local HTTP server,
then appends a finite loss and waits for the resolve (not timed). Printed:
p50 / p95 / max over TRIALS for the native watcher (inotify) and for polling
every second (what network filesystems get), and their ratio. The issue's
target: p95 under 1 s with the native watcher.

    python bench/latency.py --trials 20
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory

RULES = """\
version: 1
rules:
  - name: loss_non_finite
    metric: loss
    severity: critical
    non_finite:
"""


class Receiver:
    """A webhook that notes when each message arrived and whether it was a resolve."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, bool]] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                title = json.loads(body).get("title", "")
                self.send_response(200)
                self.end_headers()
                with receiver.changed:
                    receiver.arrivals.append((at, "resolved" in title.lower()))
                    receiver.changed.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 30.0) -> float:
        """The arrival time of message number `count` (1-based), once it is there."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.arrivals) >= count, timeout):
                raise TimeoutError(f"message {count} never arrived")
            return self.arrivals[count - 1][0]


def trial_run(tmp: Path, trials: int, poll: float | None) -> list[float]:
    root, run = tmp / "logs", tmp / "logs" / "job"
    run.mkdir(parents=True)
    (tmp / "rules.yaml").write_text(RULES)
    log = run / "metrics.jsonl"
    log.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n")
    receiver = Receiver()
    args = [sys.executable, "-m", "trainsentry", "run", str(root), "--http", "off"]
    args += ["--state-dir", str(tmp / "state"), "--rules", str(tmp / "rules.yaml")]
    args += ["--notify", receiver.url, "--rate-limit", "off"]
    if poll is not None:
        args += ["--poll", str(poll)]
    daemon = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert daemon.stderr is not None
    for line in daemon.stderr:  # alerts are live from here on
        if "caught up" in line:
            break
    threading.Thread(target=daemon.stderr.read, daemon=True).start()  # keep the pipe drained
    lags: list[float] = []
    step = 1
    try:
        with log.open("a") as f:
            for i in range(trials):
                time.sleep(0.3)  # let the previous cycle settle: each trial starts idle
                f.write(json.dumps({"step": step, "loss": float("nan")}) + "\n")
                f.flush()
                written = time.time()
                lags.append(receiver.wait(2 * i + 1) - written)
                f.write(json.dumps({"step": step + 1, "loss": 1.0}) + "\n")
                f.flush()
                receiver.wait(2 * i + 2)
                step += 2
    finally:
        daemon.terminate()
        daemon.wait(30)
        receiver.server.shutdown()
    return lags


def summary(lags: list[float]) -> tuple[float, float, float]:
    ordered = sorted(lags)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, ordered[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--poll", type=float, default=1.0, help="the polling peer's interval")
    args = parser.parse_args()
    results = {}
    for name, poll in (("native watcher", None), (f"polling every {args.poll:g} s", args.poll)):
        with TemporaryDirectory() as tmp:
            results[name] = summary(trial_run(Path(tmp), args.trials, poll))
    print(f"write → notification received, {args.trials} trials each")
    for name, (p50, p95, worst) in results.items():
        ms = [
            f"{label} {v * 1000:6.0f} ms"
            for label, v in (("p50", p50), ("p95", p95), ("max", worst))
        ]
        print(f"  {name:<22} " + "   ".join(ms))
    (n50, n95, _), (q50, q95, _) = results.values()
    print(f"  native / polling: p50 x{n50 / q50:.2f}, p95 x{n95 / q95:.2f}")
    print(f"  target p95 < 1000 ms with the native watcher: {'met' if n95 < 1.0 else 'MISSED'}")


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
