"""`trainsentry notify-test` and the run command's notification options."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.notify_endpoints import HttpReceiver, SmtpReceiver


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


def trainsentry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", *args], capture_output=True, text=True, timeout=60
    )


def test_notify_test_reports_each_route_and_fails_if_one_failed(http: HttpReceiver) -> None:
    smtp = SmtpReceiver()
    try:
        done = trainsentry(
            "notify-test",
            f"json://{http.url}/s3cr3tT0ken12345",
            f"mailto://127.0.0.1:{smtp.port}?from=s@example.com&to=o@example.com&mode=insecure",
            "json://127.0.0.1:1/",
            "--alertmanager",
            f"http://{http.url}",
            "--link-template",
            "http://tb:6006/#scalars&regexInput={run}",
        )
        assert smtp.wait_for(1)
    finally:
        smtp.close()
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["ok", "ok", "FAILED", "ok"]
    assert "retryable" in lines[2]
    assert "s3cr3tT0ken12345" not in done.stdout + done.stderr
    paths = sorted(r.path for r in http.requests)
    assert paths == ["/api/v2/alerts", "/s3cr3tT0ken12345"]
    hook = next(r for r in http.requests if r.path != "/api/v2/alerts").json()
    assert "regexInput=trainsentry-notify-test%2Frun0" in hook["message"]
    assert len(hook["attachments"]) == 1


def test_notify_test_succeeds_when_every_route_does(http: HttpReceiver) -> None:
    done = trainsentry("notify-test", f"critical:json://{http.url}/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok")


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["notify-test"], "at least one URL"),
        (["notify-test", "not-a-url"], "not a notification URL"),
        (["notify-test", "--alertmanager", "ftp://x"], "not an Alertmanager URL"),
        (["run", "--notify", "env:TRAINSENTRY_NO_SUCH_VAR", "."], "is not set"),
        (
            ["run", "--notify", "warnin:json://127.0.0.1:18081/x", "."],
            "warnin:json://(not an apprise URL): not a URL apprise knows (check the scheme); "
            "did you mean `warning:`",
        ),
        (
            ["run", "--notify", "critical:foo://secret-token-1234", "."],
            "foo://(not an apprise URL)",
        ),
        (["notify-test", "foo://x"], "foo://(not an apprise URL): not a URL apprise knows"),
    ],
)
def test_bad_routes_are_usage_errors_with_one_line(args: list[str], reason: str) -> None:
    done = trainsentry(*args)
    assert done.returncode == 2
    assert reason in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "secret-token" not in done.stderr
