"""Push alerts to Alertmanager's v2 API, as Prometheus does.

One sink per Alertmanager instance, never a load balancer in front of a
cluster: each instance must hear every alert for its gossip to deduplicate.
A fleet of daemons can then share one Alertmanager for silences, inhibition
and routing.

Alertmanager forgets an alert at its `endsAt`. Like Prometheus, a firing alert
is re-sent every resend interval (the route's repeat interval, a minute) with
`endsAt` four intervals ahead: a daemon that dies lets its alerts expire
instead of paging forever. A resolve is the same label set with `endsAt` at
the moment it resolved. Severity is a label, so an escalation is a new label
set: the warning's set is ended in the same request.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any

from trainsentry.sinks.base import Message, SendResult
from trainsentry.sinks.masking import mask_url

# Alertmanager forgets an alert at its endsAt; a firing one is re-sent this often
# and asserted valid for four times as long (Prometheus' resend delay and factor).
RESEND_SECONDS = 60.0
VALID_FOR_SECONDS = 4 * RESEND_SECONDS


def iso(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _labels(alert: dict[str, Any], severity: str) -> dict[str, str]:
    labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items() if v != ""}
    labels.update(
        alertname=str(alert["rule"]),
        run=str(alert["run"]),
        severity=severity,
        rule=str(alert["rule"]),
        metric=str(alert["metric"]),
        family=str(alert.get("family") or alert["rule"]),
    )
    return labels


def to_alertmanager(payloads: tuple[dict[str, Any], ...], now: float) -> list[dict[str, Any]]:
    """The v2 `postableAlerts` for a batch; a later row of the same label set wins."""
    out: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for p in payloads:
        alert = p["alert"]
        resolved = alert["state"] == "resolved"
        value = alert.get("value")
        description = [str(alert.get("message", ""))]
        if isinstance(value, (int, float)) and math.isfinite(value):
            description.append(f"value {value:.6g} at step {alert.get('step')}")
        if p.get("reason"):
            description.append(f"reason: {p['reason']}")
        annotations = {
            "summary": str(alert.get("message", "")),
            "description": "; ".join(description),
        }
        if alert.get("runbook"):
            annotations["runbook"] = str(alert["runbook"])
        entry: dict[str, Any] = {
            "labels": _labels(alert, str(alert["severity"])),
            "annotations": annotations,
            "startsAt": iso(float(p.get("since", p.get("at", now)))),
            "endsAt": iso(float(p.get("at", now)) if resolved else now + VALID_FOR_SECONDS),
        }
        if p.get("link"):
            entry["generatorURL"] = str(p["link"])
        if alert.get("escalated_from") and not resolved:
            old = dict(entry, labels=_labels(alert, str(alert["escalated_from"])))
            old["endsAt"] = iso(float(p.get("at", now)))
            out[tuple(sorted(old["labels"].items()))] = old
        out[tuple(sorted(entry["labels"].items()))] = entry
    return list(out.values())


class AlertmanagerSink:
    takes_attachments = False

    def __init__(self, url: str, timeout: float, clock: Any = None) -> None:
        import time

        self._endpoint = url.rstrip("/") + "/api/v2/alerts"
        self._timeout = timeout
        self._clock = clock or time.time
        self.name = mask_url(url)

    def send(self, message: Message) -> SendResult:
        body = json.dumps(to_alertmanager(message.alerts, self._clock())).encode()
        request = urllib.request.Request(
            self._endpoint,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
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
