"""The seam between delivery and the services: one message in, one result out.

Alertmanager's notifier contract: every send returns whether it worked and, if
not, whether trying again could help. The outbox retries what is retryable with
backoff (an endpoint that is down delays, never loses), and gives up at once on
what is not (a URL apprise does not know, a 400 for a payload it will reject
again), so a misconfigured receiver cannot spin.

A send that timed out is *ambiguous*: the receiver may have taken it and
answered too late. Retrying it may deliver it twice, so every message carries a
stable idempotency key (`Message.key`, in the body and, where the service takes
headers, as `Idempotency-Key`) for receivers to drop repeats by; each retry
waits longer for an answer (`timeout_for`); and after AMBIGUOUS_TRIES
unanswered sends in a row the notification is given up, loudly (dispatch.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainsentry.alert import Notice

AMBIGUOUS_TRIES = 5  # unanswered sends in a row before a notification is given up
TIMEOUT_GROWTH_AT_MOST = 8  # the n-th retry waits 2^n times the timeout, at most this


def timeout_for(timeout: float, attempt: int) -> float:
    """How long the `attempt`-th send (0: the first) waits for an answer: a slow
    receiver answering after the timeout gets a longer wait next time, not a repeat."""
    return timeout * min(2 ** max(0, attempt), TIMEOUT_GROWTH_AT_MOST)


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retryable: bool = False
    error: str = ""
    ambiguous: bool = False  # no answer in time: it may have been delivered

    @classmethod
    def success(cls) -> SendResult:
        return cls(True)

    @classmethod
    def retry(cls, error: str) -> SendResult:
        return cls(False, True, error)

    @classmethod
    def unanswered(cls, error: str) -> SendResult:
        return cls(False, True, error, ambiguous=True)

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

    # markdown; a `Marked` (forwarded_text.py) keeps apart what the job wrote, for the
    # sinks that make it inert; as a str, the exact text
    title: str
    body: str
    severity: str  # the highest severity in the message: "critical" | "warning" | "resolved"
    attachments: tuple[Path, ...] = ()
    alerts: tuple[Notice, ...] = field(default_factory=tuple)
    key: str = ""  # the same for every send of these notifications: receivers dedup by it
    attempt: int = 0  # sends of it before this one


class Sink(Protocol):
    """A receiver's transport. `name` is safe to log: secrets are masked."""

    name: str
    takes_attachments: bool

    def send(self, message: Message) -> SendResult: ...
