"""The apprise sink against real local endpoints: a JSON webhook and an SMTP server."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.notify_endpoints import HttpReceiver, SmtpReceiver
from support.notify_harness import Harness, transition

from trainsentry.alerts.route import Route, RouteError, parse_notify
from trainsentry.point import Point
from trainsentry.sinks.apprise_sink import AppriseSink, classify_failure
from trainsentry.sinks.base import Message
from trainsentry.sinks.masking import mask_url
from trainsentry.store import Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


def growing_store(now: float) -> Store:
    store = Store()
    for step in range(50):
        store.add(Point("exp1/seed0", "train/loss", step, now + step, 1.0 + 0.5 * step))
    return store


def send_through_notifier(tmp: Path, url: str) -> Harness:
    """A critical with its incident bundle, through the real sink, as the daemon sends it."""
    route = Route("apprise", url, group_wait=0.0, timeout=5.0)
    h = Harness(tmp, route, store=growing_store(time.time()))
    h.notifier.lanes[route.receiver].sink = AppriseSink(url, route.timeout)
    h.notifier.submit([transition(severity="critical", step=49, value=25.5)])
    h.deliver()
    return h


def test_a_json_webhook_gets_title_markdown_body_and_the_plot(
    tmp_path: Path, http: HttpReceiver
) -> None:
    h = send_through_notifier(tmp_path, f"json://{http.url}/hook")
    [request] = http.requests
    payload = request.json()
    assert payload["title"].startswith("[CRITICAL] exp1/seed0: loss_spike")
    assert "loss = 25.5 (`train/loss`) at step 49" in payload["message"]
    [attachment] = payload["attachments"]
    assert attachment["mimetype"] == "image/png"
    assert base64.b64decode(attachment["base64"]).startswith(PNG_MAGIC)
    assert h.outbox.counts()["sent"] == 1
    assert (tmp_path / "incidents" / "exp1" / "seed0" / "loss_spike-49.png").exists()


def test_mail_through_a_local_smtp_server_is_multipart_with_the_plot(tmp_path: Path) -> None:
    smtp = SmtpReceiver()
    try:
        url = f"mailto://127.0.0.1:{smtp.port}?from=sentry@example.com&to=ops@example.com&mode=insecure"
        send_through_notifier(tmp_path, url)
        assert smtp.wait_for(1)
    finally:
        smtp.close()
    [mail] = smtp.mails
    assert mail.is_multipart()
    assert "CRITICAL" in str(mail["Subject"]) or "CRITICAL" in mail.as_string()
    pngs = [p for p in mail.walk() if p.get_content_type() == "image/png"]
    assert len(pngs) == 1
    payload = pngs[0].get_payload(decode=True)
    assert isinstance(payload, bytes) and payload.startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("status", "retryable"), [(503, True), (429, True), (400, False), (404, False)]
)
def test_a_refusal_says_whether_to_retry(http: HttpReceiver, status: int, retryable: bool) -> None:
    http.status = status
    result = AppriseSink(f"json://{http.url}/", 5.0).send(Message("t", "b", "warning"))
    assert not result.ok
    assert result.retryable is retryable
    assert str(status) in result.error


def test_an_endpoint_that_is_down_is_retryable() -> None:
    result = AppriseSink("json://127.0.0.1:1/", 5.0).send(Message("t", "b", "warning"))
    assert (result.ok, result.retryable) == (False, True)


def test_a_hanging_endpoint_times_out_as_retryable(http: HttpReceiver) -> None:
    http.hold = True
    result = AppriseSink(f"json://{http.url}/", 0.5).send(Message("t", "b", "critical"))
    assert (result.ok, result.retryable) == (False, True)


def test_service_timeouts_are_lowered_to_the_send_timeout() -> None:
    sink = AppriseSink(
        "mailto://127.0.0.1:2525?from=s@example.com&to=a@example.com&mode=insecure", 3.0
    )
    [service] = list(sink._apprise)
    assert service.socket_connect_timeout <= 3.0
    assert service.socket_read_timeout <= 3.0


def test_an_unknown_scheme_is_not_retried() -> None:
    result = AppriseSink("nosuchservice://x", 5.0).send(Message("t", "b", "warning"))
    assert (result.ok, result.retryable) == (False, False)


def test_secrets_never_appear_in_a_sink_name() -> None:
    names = [
        AppriseSink("json://127.0.0.1:5/hooks/s3cr3tT0ken12345", 5).name,
        AppriseSink("mailto://user:hunter2pass@example.com?to=a@example.com", 5).name,
        AppriseSink(
            "https://hooks.slack.com/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ", 5
        ).name,
        mask_url("http://admin:pw123@am.example.com:9093/?token=abc"),
    ]
    for secret in ("s3cr3tT0ken12345", "hunter2pass", "TIiajkdnlazkcOXrIdevi7FQ", "pw123", "abc"):
        assert not any(secret in n for n in names), (secret, names)


def test_route_syntax(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parse_notify("critical:json://h/").min_severity == "critical"
    assert parse_notify("json://h/").min_severity == "warning"
    monkeypatch.setenv("HOOK_URL", "json://from-env/")
    assert parse_notify("critical:env:HOOK_URL").url == "json://from-env/"
    (tmp_path / "url").write_text("json://from-file/\n")
    assert parse_notify(f"@{tmp_path / 'url'}").url == "json://from-file/"
    with pytest.raises(RouteError, match="not set"):
        parse_notify("env:NO_SUCH_VARIABLE_HERE")
    with pytest.raises(RouteError, match="not a notification URL"):
        parse_notify("hooks.slack.com/services/x")


def test_failure_classification_reads_the_status_apprise_logged() -> None:
    assert classify_failure(["Failed to send: Bad Request error=400."], False).retryable is False
    assert classify_failure(["Failed: Service Unavailable error=503."], False).retryable is True
    assert classify_failure([], True).retryable is True
