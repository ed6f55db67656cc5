"""A run's trace as the sources hand it on: what the run was started with.

A tracker keeps it beside the metrics (MLflow's params and tags, W&B's
config); the person paged needs it before anything else, to know which run
this is (which lr, which seed, which commit). Values are what people type into
configs, and configs hold credentials by accident (`wandb.config.hf_token`,
an `api_key` param): each entry is masked as a text-log line is
(secrets.py), before the store, a bundle or /api/runs sees it, and cut to a
length a page can show.
"""

from __future__ import annotations

import json
from typing import Any

from trainsentry.point import RunEnd, Trace
from trainsentry.sources.base import Decoded
from trainsentry.sources.secrets import mask_secrets

VALUE_CHARS = 500  # a value longer than this (a whole config as JSON) is cut
KEY_CHARS = 250  # MLflow's own limit on a param key


def entry(key: str, value: str) -> tuple[str, str]:
    """(key, value) cut and masked: a secret-looking key masks its value."""
    key = key[:KEY_CHARS]
    value = value if len(value) <= VALUE_CHARS else value[: VALUE_CHARS - 1] + "…"
    masked = mask_secrets(f"{key}={value}")
    return key, masked[masked.index("=") + 1 :] if "=" in masked else masked


def flatten(key: str, value: Any, out: list[tuple[str, str]], *, lists: bool = True) -> None:
    """A config value as trace entries: an object's keys joined to `key` with `/` (as
    nested metric keys are), a string as it is, anything else as JSON; lists left out
    unless `lists`."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            flatten(f"{key}/{k}", v, out, lists=lists)
    elif isinstance(value, str):
        out.append((key, value))
    elif lists or not isinstance(value, list):
        out.append((key, json.dumps(value)))


def section(pairs: list[tuple[str, str]] | dict[str, str]) -> dict[str, str]:
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return dict(entry(k, v) for k, v in items)


SNAPSHOT_ENTRIES = 200  # of a file's trace kept in its checkpoint, said again after a restart


class TraceMemory:
    """A decoder's memory of the trace its file told, and of the run's end: kept in the
    decoder's snapshot, because the records that told them (the probe's meta record,
    W&B's run record) lie before the offset a restarted daemon resumes at, and a daemon
    keeps no run's trace or life of its own. Said again with the first feed after a
    restore."""

    def __init__(self) -> None:
        self.trace: Trace = {}
        self.ended: RunEnd | None = None
        self._resend = False

    def add(self, out: Decoded, name: str, pairs: list[tuple[str, str]]) -> None:
        """Tell `pairs` as section `name` of the trace, masked and cut, and keep them."""
        if not pairs:
            return
        got = section(pairs)
        out.trace.setdefault(name, {}).update(got)
        kept = self.trace.setdefault(name, {})
        room = SNAPSHOT_ENTRIES - sum(map(len, self.trace.values()))
        for key, value in got.items():
            if key in kept or room > 0:
                room -= key not in kept
                kept[key] = value

    def end(self, out: Decoded, end: RunEnd) -> None:
        """Tell the run's end; a preemption notice is superseded by the exit that follows."""
        if self.ended is None or self.ended.state == "preempted":
            self.ended = end
            out.ends.append(end)

    def resend(self, out: Decoded) -> None:
        if self._resend:
            self._resend = False
            out.trace = {k: dict(v) for k, v in self.trace.items()}
            out.ends = [self.ended] if self.ended is not None else []

    def snapshot(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.trace:
            state["trace"] = self.trace
        if self.ended is not None:
            state["ended"] = [self.ended.state, self.ended.cause, self.ended.wall]
        return state

    def restore(self, state: dict[str, Any]) -> None:
        self.trace = {k: dict(v) for k, v in state.get("trace", {}).items()}
        ended = state.get("ended")
        self.ended = RunEnd(ended[0], ended[1], float(ended[2])) if ended else None
        self._resend = bool(self.trace or self.ended)
