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

from trainsentry.point import Trace
from trainsentry.sources.secrets import mask_secrets

VALUE_CHARS = 500  # a value longer than this (a whole config as JSON) is cut
KEY_CHARS = 250  # MLflow's own limit on a param key


def entry(key: str, value: str) -> tuple[str, str]:
    """(key, value) cut and masked: a secret-looking key masks its value."""
    key = key[:KEY_CHARS]
    value = value if len(value) <= VALUE_CHARS else value[: VALUE_CHARS - 1] + "…"
    masked = mask_secrets(f"{key}={value}")
    return key, masked[masked.index("=") + 1 :] if "=" in masked else masked


def section(pairs: list[tuple[str, str]] | dict[str, str]) -> dict[str, str]:
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return dict(entry(k, v) for k, v in items)


def merge(into: Trace, more: Trace) -> None:
    for name, entries in more.items():
        into.setdefault(name, {}).update(entries)
