"""Routes from the config file: each receiver gets the alerts its severity and labels select."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support.notify_endpoints import HttpReceiver

RULES = """\
rules:
  - name: loss_high
    metric: loss
    severity: warning
    labels: {team: nlp}
    threshold: {above: 10}
  - name: loss_nan
    metric: loss
    severity: critical
    labels: {team: vision}
    non_finite: {}
"""


def test_config_routes_filter_by_severity_and_labels(tmp_path: Path) -> None:
    everything, pages, nlp = HttpReceiver(), HttpReceiver(), HttpReceiver()
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "config.yaml").write_text(
        f"""\
rules: [rules.yaml]
http: {{address: "off"}}
history: all
notify:
  group_wait: 0s
  routes:
    - url: json://{everything.url}/
    - url: json://{pages.url}/
      severity: critical
    - url: json://{nlp.url}/
      match: {{team: nlp}}
"""
    )
    run = tmp_path / "logs" / "job"
    run.mkdir(parents=True)
    (run / "m.jsonl").write_text(
        '{"step": 1, "loss": 1}\n{"step": 2, "loss": 50}\n{"step": 3, "loss": NaN}\n'
    )
    config, state = tmp_path / "config.yaml", tmp_path / "s"
    command = ["run", str(tmp_path / "logs"), "--config", str(config), "--state-dir", str(state)]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert everything.wait_for(lambda rs: "loss_nan" in str([r.body for r in rs]))
        assert everything.wait_for(lambda rs: "loss_high" in str([r.body for r in rs]))
        assert pages.wait_for(lambda rs: len(rs) >= 1)
        assert nlp.wait_for(lambda rs: len(rs) >= 1)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        for receiver in (everything, pages, nlp):
            receiver.close()
    page_bodies = " ".join(r.body.decode() for r in pages.accepted())
    nlp_bodies = " ".join(r.body.decode() for r in nlp.accepted())
    assert "loss_nan" in page_bodies and "loss_high" not in page_bodies
    assert "loss_high" in nlp_bodies and "loss_nan" not in nlp_bodies
