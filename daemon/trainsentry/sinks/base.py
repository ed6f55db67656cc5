"""The seam between delivery and the services: one message in, one result out.

Alertmanager's notifier contract: every send returns whether it worked and, if
not, whether trying again could help. The outbox retries what is retryable with
backoff, forever (an endpoint that is down delays, never loses), and gives up at
once on what is not (a URL apprise does not know, a 400 for a payload it will
reject again), so a misconfigured receiver cannot spin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainsentry.alert import Notice


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retryable: bool = False
    error: str = ""

    @classmethod
    def success(cls) -> SendResult:
        return cls(True)

    @classmethod
    def retry(cls, error: str) -> SendResult:
        return cls(False, True, error)

    @classmethod
    def fatal(cls, error: str) -> SendResult:
        return cls(False, False, error)


@dataclass(frozen=True, slots=True)
class Message:
    """One notification as a person reads it, plus the alerts it carries for machines.

    `alerts` are the notices (a transition with its context) in the order they
    happened; a sink that speaks a structured protocol
    (Alertmanager) reads those instead of the text.
    """

    title: str
    body: str  # markdown
    severity: str  # the highest severity in the message: "critical" | "warning" | "resolved"
    attachments: tuple[Path, ...] = ()
    alerts: tuple[Notice, ...] = field(default_factory=tuple)


class Sink(Protocol):
    """A receiver's transport. `name` is safe to log: secrets are masked."""

    name: str
    takes_attachments: bool

    def send(self, message: Message) -> SendResult: ...
