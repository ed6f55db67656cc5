"""The daemon against a real Alertmanager (Debian's prometheus-alertmanager, 0.25).

The stand-in receiver of test_notify_alertmanager.py shows what is posted and
serves fault injection; this shows what a user of Alertmanager then sees in its
own `/api/v2/alerts`: the alert with its labels, its re-sends keeping it alive,
its resolve, on every instance of a two-instance cluster, and behind basic
auth. `.ci/run` installs the package; where it cannot be installed these
tests are skipped, saying so.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess
from support.ports import free_port
from support.waiting import wait_until as until

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(
    BINARY is None,
    reason="no Alertmanager binary (apt-get install prometheus-alertmanager; .ci/run does)",
)
CONFIG = """\
route:
  receiver: "null"
  group_wait: 0s
receivers:
  - name: "null"
"""
STEP = '{{"step": {step}, "loss": {loss}}}\n'


class Alertmanager:
    def __init__(
        self,
        tmp: Path,
        name: str,
        *,
        peers: tuple[int, ...] = (),
        cluster_port: int | None = None,
        web_config: str | None = None,
        auth: tuple[str, str] | None = None,
    ) -> None:
        assert BINARY is not None
        home = tmp / name
        home.mkdir()
        (home / "am.yml").write_text(CONFIG)
        self.port = free_port()
        self.auth = auth
        args = [
            BINARY, f"--config.file={home / 'am.yml'}", f"--storage.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ]  # fmt: skip
        if cluster_port is None:
            args.append("--cluster.listen-address=")
        else:
            args += [
                f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                f"--cluster.advertise-address=127.0.0.1:{cluster_port}",
                *(f"--cluster.peer=127.0.0.1:{p}" for p in peers),
                "--cluster.reconnect-timeout=10s",
            ]
        if web_config is not None:
            (home / "web.yml").write_text(web_config)
            args.append(f"--web.config.file={home / 'web.yml'}")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        until(lambda: self._get("/-/ready") is not None, "Alertmanager ready")

    @property
    def url(self) -> str:
        if self.auth is None:
            return f"http://127.0.0.1:{self.port}"
        return f"http://{self.auth[0]}:{self.auth[1]}@127.0.0.1:{self.port}"

    def _get(self, path: str) -> bytes | None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if self.auth is not None:
            secret = base64.b64encode(":".join(self.auth).encode()).decode()
            request.add_header("Authorization", f"Basic {secret}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return bytes(response.read())
        except OSError:
            return None

    def alerts(self) -> list[dict]:
        """What a user of this Alertmanager sees: its active alerts."""
        body = self._get("/api/v2/alerts?active=true")
        return json.loads(body) if body else []

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def ours(am: Alertmanager) -> list[dict]:
    return [a for a in am.alerts() if a["labels"].get("run") == "exp"]


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "logs" / "exp").mkdir(parents=True)
    (tmp_path / "rules.yaml").write_text(
        "rules:\n  - name: loss_high\n    metric: loss\n    severity: critical\n"
        "    family: loss\n    labels: {team: nlp}\n    runbook: Lower the learning rate.\n"
        "    threshold: {above: 100}\n"
    )
    yield tmp_path / "logs" / "exp" / "metrics.jsonl"


def start(tmp: Path, *urls: str, resend: float | None = None) -> DaemonProcess:
    args = [
        str(tmp / "logs"),
        "--state-dir",
        str(tmp / "state"),
        "--rules",
        str(tmp / "rules.yaml"),
    ]
    args += ["--http", "off", "--history", "all"]
    if resend is None:
        for url in urls:
            args += ["--alertmanager", url]
    else:  # through the config file, where the resend interval is set
        members = "".join(f"    - {{url: '{u}', resend_interval: {resend}s}}\n" for u in urls)
        (tmp / "config.yaml").write_text(f"notify:\n  alertmanagers:\n{members}")
        args += ["--config", str(tmp / "config.yaml")]
    return DaemonProcess(*args, merge_stderr=True)


@pytest.mark.timeout(300)
def test_a_cluster_sees_the_alert_fire_stay_alive_and_resolve(tmp_path: Path, logs: Path) -> None:
    """Both instances are named, as a cluster must be; each lists the alert with its labels,
    sees it re-sent (its endsAt pushed on) while it fires, and resolved once it ends. The
    resend interval is the config's 5 s (a minute by default): the same path, sooner."""
    ports = (free_port(), free_port())
    first = Alertmanager(tmp_path, "am0", cluster_port=ports[0], peers=(ports[1],))
    second = Alertmanager(tmp_path, "am1", cluster_port=ports[1], peers=(ports[0],))
    logs.write_text("".join(STEP.format(step=s, loss=1.0) for s in range(5)))
    daemon = start(tmp_path, first.url, second.url, resend=5)
    try:
        logs.open("a").write(STEP.format(step=5, loss=500.0))
        for am in (first, second):
            until(lambda am=am: len(ours(am)) == 1, "the firing alert on each instance")
        (alert,) = ours(first)
        assert {k: alert["labels"][k] for k in ("alertname", "severity", "rule", "metric")} == {
            "alertname": "loss_high", "severity": "critical", "rule": "loss_high", "metric": "loss"
        }  # fmt: skip
        assert alert["labels"]["team"] == "nlp" and alert["labels"]["family"] == "loss"
        assert alert["annotations"]["runbook"] == "Lower the learning rate."
        assert alert["status"]["state"] == "active"
        ends = alert["endsAt"]
        until(lambda: [a["endsAt"] for a in ours(first)] not in ([ends], []), "a re-send", 60)
        logs.open("a").write(STEP.format(step=6, loss=1.0))  # recovered
        for am in (first, second):
            until(lambda am=am: ours(am) == [], "the resolve on each instance", 150)
    finally:
        daemon.stop()
        first.close()
        second.close()


def test_credentials_in_the_url_reach_an_alertmanager_behind_basic_auth(
    tmp_path: Path, logs: Path
) -> None:
    bcrypt = pytest.importorskip("bcrypt")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    am = Alertmanager(
        tmp_path, "am", web_config=f"basic_auth_users:\n  alice: {hashed}\n",
        auth=("alice", "s3cret"),
    )  # fmt: skip
    logs.write_text(STEP.format(step=1, loss=500.0))
    daemon = start(tmp_path, am.url)
    try:
        until(lambda: len(ours(am)) == 1, "the alert behind basic auth")
    finally:
        daemon.stop()
        am.close()
    assert "s3cret" not in "".join(daemon.lines)
