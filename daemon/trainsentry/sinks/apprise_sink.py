"""Any apprise URL (Slack, email, Teams, Telegram, ntfy, Mattermost, webhooks ...).

apprise knows a hundred services; what it does not give is the notifier
contract the outbox needs, so this wraps one URL in it:

- *retryable?* apprise returns success, failure or timeout per service, and
  logs the HTTP status of a refusal. A 4xx other than 408/429 is the
  receiver saying "never" (bad token, unknown channel): not retried. Timeouts,
  connection errors and 5xx are: the endpoint may come back.
- *timeouts that hold.* `notify(timeout=)` stops *waiting* for a service but
  leaves its thread running; a service whose own connect/read timeouts are
  longer (email's connect timeout is 15 s) could still deliver after we gave
  up and retried — a duplicate. So each service's `cto`/`rto` are lowered to
  the route's timeout, and the call's own timeout is only a backstop above it.
- *no secrets in logs.* The sink's name is apprise's privacy form of the URL,
  and apprise's own log lines are captured per call, not printed.
- *job text that cannot page anyone.* What the job wrote is made inert for
  the service's markup before apprise sees it (forwarded_text.py).
- *which failures may have arrived.* apprise says "a connection error" alike
  for a refused connection and a read timeout; its debug lines (captured,
  never shown: they quote the payload) tell them apart, and only a read
  timeout is ambiguous (base.py). Each retry waits longer for the answer; the
  connect timeout stays (no connection, nothing delivered).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from trainsentry.sinks.base import Message, SendResult, timeout_for
from trainsentry.sinks.forwarded_text import target_of
from trainsentry.sinks.masking import mask_url, scheme_only

log = logging.getLogger(__name__)

_STATUS = re.compile(r"\berror=(\d{3})\b")
_NOT_RETRYABLE_KEEP = frozenset({408, 425, 429})

# apprise logs through the "apprise" logger and can quote endpoints: its lines are
# captured per call (notify(log_level=)) and reported through SendResult, not printed;
# its debug lines are made at all (DEBUG) because they tell a read timeout apart
logging.getLogger("apprise").propagate = False
logging.getLogger("apprise").setLevel(logging.DEBUG)
_READ_TIMEOUT = re.compile(r"Read timed out|ReadTimeout")


def _notify_type(severity: str) -> Any:
    from apprise import NotifyType

    return {
        "critical": NotifyType.FAILURE,
        "warning": NotifyType.WARNING,
        "resolved": NotifyType.SUCCESS,
    }.get(severity, NotifyType.INFO)


def classify_failure(lines: Iterable[str], timed_out: bool) -> SendResult:
    """Retryable unless the service answered with a client error that will not change;
    `timed_out`: no answer came in time (it may have arrived)."""
    text = " | ".join(line for line in lines if line)[:500]
    if timed_out:
        return SendResult.unanswered(f"timed out {text}".strip())
    codes = [int(c) for c in _STATUS.findall(text)]
    if codes and all(400 <= c < 500 and c not in _NOT_RETRYABLE_KEEP for c in codes):
        return SendResult.fatal(text or f"HTTP {codes[0]}")
    return SendResult.retry(text or "failed (no reason given)")


UNKNOWN = "not a URL apprise knows (check the scheme)"


def _service(url: str) -> Any:
    """apprise's plugin for `url`, None for a URL no plugin takes (a typo in the scheme)."""
    import apprise

    return apprise.Apprise.instantiate(url)


def unknown_url(url: str) -> str | None:
    """None if apprise can send to `url`, else its masked name: only the scheme is shown.

    The one check behind both `notify-test` and the routes of `run`, so a typo
    is refused at startup instead of every notification failing later.
    """
    return None if _service(url) is not None else scheme_only(url, "(not an apprise URL)")


class AppriseSink:
    def __init__(self, url: str, timeout: float) -> None:
        import apprise

        self._apprise = apprise.Apprise()
        service = _service(url)
        self.valid = service is not None
        if service is None:
            self.name = unknown_url(url) or url
            self.takes_attachments = False
            return
        for attr in ("socket_connect_timeout", "socket_read_timeout"):
            current = getattr(service, attr, None)
            if isinstance(current, (int, float)) and current > timeout:
                setattr(service, attr, float(timeout))
        self._service = service
        self._target = target_of(service)
        self._timeout = timeout
        self._apprise.add(service)
        self.name = mask_url(service.url(privacy=True))
        self.takes_attachments = bool(getattr(service, "attachment_support", False))

    def send(self, message: Message) -> SendResult:
        if not self.valid:
            return SendResult.fatal(UNKNOWN)
        service = self._service
        wait = timeout_for(self._timeout, message.attempt)
        if isinstance(getattr(service, "socket_read_timeout", None), (int, float)):
            service.socket_read_timeout = wait
        headers = getattr(service, "headers", None)
        if isinstance(headers, dict) and message.key:  # json://, form://, xml:// webhooks
            headers["Idempotency-Key"] = message.key
        from apprise import AppriseAttachment
        from apprise.result import AppriseResultStatus

        attach = None
        if message.attachments and self.takes_attachments:
            attach = AppriseAttachment()
            for path in message.attachments:
                attach.add(str(path))
        try:
            result = self._apprise.notify(
                body=self._target.render(message.body),
                title=self._target.render(message.title, title=True),
                notify_type=_notify_type(message.severity),
                body_format="markdown",
                attach=attach,
                # beyond the service's own connect + read timeouts: only a stuck one hits it
                timeout=self._timeout + wait + 5.0,
                log_level=logging.DEBUG,
            )
        except Exception as exc:  # a plugin bug must not kill the delivery worker
            return SendResult.retry(f"{type(exc).__name__}: {exc}")
        if result:
            return SendResult.success()
        logs = list(result.logs())
        lines = [e.message for e in logs if e.level not in ("DEBUG", "TRACE", "INFO")]
        unanswered = result.status == AppriseResultStatus.TIMEOUT or any(
            _READ_TIMEOUT.search(e.message) for e in logs if e.level == "DEBUG"
        )
        return classify_failure(lines, unanswered)
