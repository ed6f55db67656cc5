"""A receiver (an apprise URL, an Alertmanager) and the alerts it wants.

Routes come from the command line now (`--notify [SEVERITY:]URL`,
`--alertmanager URL`) and from the config file later; both build this one
object, so routing by labels and per-route timing are fields, not new code.

A receiver is named in the state database by a hash of its URL: the outbox
survives restarts without ever writing a webhook token or a password to disk,
and changing a route's filter keeps its queue.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from trainsentry.rules.model import SEVERITY_RANK
from trainsentry.sinks.alertmanager import RESEND_SECONDS as ALERTMANAGER_RESEND_SECONDS
from trainsentry.sinks.masking import mask_url

RouteKind = Literal["apprise", "alertmanager", "command"]

GROUP_WAIT_SECONDS = 30.0
# Alertmanager's group_interval: a run's alerts that fire after its first page join that
# incident and leave together at most this often, rather than paging one by one.
GROUP_INTERVAL_SECONDS = 300.0
REPEAT_INTERVAL_SECONDS = 4 * 3600.0
RATE_LIMIT = (10, 600.0)  # messages per seconds, per receiver
SEND_TIMEOUT_SECONDS = 10.0

_SEVERITY_PREFIX = re.compile(r"^(warning|critical):(?!//)(.+)$", re.DOTALL)


class RouteError(ValueError):
    """A route the user wrote that cannot work; the message says why (without the secret)."""


@dataclass(frozen=True, slots=True)
class Route:
    kind: RouteKind
    url: str  # may hold secrets: never log it, use `name` (set by the sink) instead
    min_severity: str = "warning"
    match_labels: tuple[tuple[str, str], ...] = ()  # all must equal (config file, later)
    group_wait: float = GROUP_WAIT_SECONDS  # warnings only; criticals go at once
    group_interval: float = GROUP_INTERVAL_SECONDS  # an open incident's later alerts; 0: at once
    repeat_interval: float = REPEAT_INTERVAL_SECONDS
    rate_limit: tuple[int, float] | None = RATE_LIMIT
    timeout: float = SEND_TIMEOUT_SECONDS
    batch: bool = True  # several alerts of a run in one message
    # A resolve leaves no sooner than this after its firing was delivered (dispatch.py).
    hold_resolve: float = 0.0

    @property
    def receiver(self) -> str:
        return f"{self.kind}:{hashlib.sha256(self.url.encode()).hexdigest()[:16]}"

    def accepts(self, severity: str, labels: dict[str, str]) -> bool:
        if SEVERITY_RANK.get(severity, 2) < SEVERITY_RANK[self.min_severity]:
            return False
        return all(labels.get(k) == v for k, v in self.match_labels)


def resolve_secret(text: str) -> str:
    """`env:NAME` and `@FILE` keep a URL's secret out of the process list and shell history."""
    if text.startswith("env:"):
        name = text[4:]
        value = os.environ.get(name)
        if not value:
            raise RouteError(f"environment variable {name} is not set")
        return value.strip()
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RouteError(f"cannot read {text[1:]}: {exc.strerror}") from None
    return text


def parse_notify(text: str, **timing: float) -> Route:
    """`[warning:|critical:]URL|env:NAME|@FILE`: an apprise route, optionally critical-only."""
    min_severity = "warning"
    match = _SEVERITY_PREFIX.match(text)
    if match:
        min_severity, text = match.group(1), match.group(2)
    url = resolve_secret(text)
    if "://" not in url:
        raise RouteError(f"not a notification URL: {mask_url(url)!r} (expected scheme://...)")
    from trainsentry.sinks.apprise_sink import UNKNOWN, unknown_url

    unknown = unknown_url(url)
    if unknown is not None:
        raise RouteError(f"{unknown}: {UNKNOWN}{_severity_hint(url)}")
    return Route("apprise", url, min_severity=min_severity, **timing)  # type: ignore[arg-type]


def _severity_hint(url: str) -> str:
    """`warnin:json://...` is a misspelt severity prefix, not a scheme: say so."""
    prefix, colon, _ = url.partition(":")
    close = difflib.get_close_matches(prefix.lower(), SEVERITY_RANK, n=1) if colon else []
    return f"; did you mean `{close[0]}:` (the severity prefix)?" if close else ""


def parse_alertmanager(
    text: str, timeout: float = SEND_TIMEOUT_SECONDS, resend: float = ALERTMANAGER_RESEND_SECONDS
) -> Route:
    url = resolve_secret(text)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RouteError(
            f"not an Alertmanager URL: {mask_url(url)!r} (expected http(s)://host:port)"
        )
    return Route(
        "alertmanager",
        url.rstrip("/"),
        group_wait=0.0,  # Alertmanager groups by itself
        group_interval=0.0,
        repeat_interval=resend,  # the sink asserts each send valid for four of these
        rate_limit=None,
        timeout=timeout,
        # Alertmanager pages for a firing alert only after its group_wait (30 s by
        # default); one resolved before then, as after an outage, never pages at all.
        hold_resolve=resend,
    )
