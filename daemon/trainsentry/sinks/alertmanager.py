"""Push alerts to Alertmanager's v2 API, as Prometheus does.

One sink per Alertmanager instance, never a load balancer in front of a
cluster: each instance must hear every alert for its gossip to deduplicate.
A fleet of daemons can then share one Alertmanager for silences, inhibition
and routing.

Alertmanager forgets an alert at its `endsAt`. Like Prometheus, a firing alert
is re-sent every resend interval (the route's repeat interval: a minute, or the
config's `resend_interval`) with
`endsAt` four intervals ahead: a daemon that dies lets its alerts expire
instead of paging forever. A resolve is the same label set with `endsAt` at
the moment it resolved. Severity is a label, so an escalation is a new label
set: the warning's set is ended in the same request.

Alertmanager deduplicates by label set, so a send that timed out is simply
sent again (never ambiguous). `http://user:pass@host:9093` sends the
credentials as HTTP basic auth, as an Alertmanager behind a proxy wants.
"""

from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from trainsentry.alert import Notice, Transition
from trainsentry.jobs import member_of
from trainsentry.sinks.base import Message, SendResult, timeout_for
from trainsentry.sinks.masking import mask_url

# Alertmanager forgets an alert at its endsAt; a firing one is re-sent this often
# (by default) and asserted valid for four times as long (Prometheus' resend delay
# and factor).
RESEND_SECONDS = 60.0
VALID_FOR_RESENDS = 4


def iso(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _labels(alert: Transition, severity: str) -> dict[str, str]:
    labels = {str(k): str(v) for k, v in alert.labels.items() if v != ""}
    labels.update(
        alertname=alert.rule,
        run=alert.run,
        severity=severity,
        rule=alert.rule,
        metric=alert.metric,
        family=alert.family or alert.rule,
    )
    # the job, and a rank's rank and attempt: Alertmanager groups a job's ranks as one
    labels.update({k: str(v) for k, v in member_of(alert.run).keys().items()})
    return labels


def to_alertmanager(
    notices: tuple[Notice, ...], now: float, resend: float = RESEND_SECONDS
) -> list[dict[str, Any]]:
    """The v2 `postableAlerts` for a batch; a later row of the same label set wins."""
    out: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for n in notices:
        alert = n.alert
        description = [alert.message]
        if math.isfinite(alert.value):
            description.append(f"value {alert.value:.6g} at step {alert.step}")
        if n.reason:
            description.append(f"reason: {n.reason}")
        annotations = {"summary": alert.message, "description": "; ".join(description)}
        if alert.runbook:
            annotations["runbook"] = alert.runbook
        entry: dict[str, Any] = {
            "labels": _labels(alert, alert.severity),
            "annotations": annotations,
            "startsAt": iso(n.since if n.since is not None else n.at),
            "endsAt": iso(n.at if n.resolved else now + VALID_FOR_RESENDS * resend),
        }
        if n.link:
            entry["generatorURL"] = n.link
        if alert.escalated_from and not n.resolved:
            old = dict(entry, labels=_labels(alert, alert.escalated_from))
            old["endsAt"] = iso(n.at)
            out[tuple(sorted(old["labels"].items()))] = old
        out[tuple(sorted(entry["labels"].items()))] = entry
    return list(out.values())


class AlertmanagerSink:
    takes_attachments = False

    def __init__(
        self, url: str, timeout: float, clock: Any = None, resend: float = RESEND_SECONDS
    ) -> None:
        import time

        parts = urlsplit(url.rstrip("/"))
        self._headers = {"Content-Type": "application/json"}
        if parts.username is not None:  # basic auth, and a URL without it to send to
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(secret.encode()).decode()
            host = parts.hostname or ""
            netloc = f"[{host}]" if ":" in host else host
            netloc += f":{parts.port}" if parts.port else ""
            parts = parts._replace(netloc=netloc)
        self._endpoint = urlunsplit(parts) + "/api/v2/alerts"
        self._timeout = timeout
        self._resend = resend
        self._clock = clock or time.time
        self.name = mask_url(url)

    def send(self, message: Message) -> SendResult:
        body = json.dumps(to_alertmanager(message.alerts, self._clock(), self._resend)).encode()
        headers = dict(self._headers)
        if message.key:
            headers["Idempotency-Key"] = message.key
        request = urllib.request.Request(self._endpoint, data=body, method="POST", headers=headers)
        wait = timeout_for(self._timeout, message.attempt)
        try:
            with urllib.request.urlopen(request, timeout=wait) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace").strip()
            text = f"HTTP {exc.code} {detail}".strip()
            if exc.code in (408, 429) or exc.code >= 500:
                return SendResult.retry(text)
            return SendResult.fatal(text)
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return SendResult.retry(f"{type(exc).__name__}: {reason}")
        return SendResult.success()
