"""The daemon's settings after validation: plain frozen dataclasses.

Pydantic stops at the file boundary (schema.py); the runtime receives these,
compares them by value on SIGHUP (what changed decides what is restarted),
and passes them around freely. Fields that hold secrets — notification URLs,
the HTTP token — are left out of `repr()`, so logging a Config never leaks one.

Defaults here are the daemon's embedded defaults: `load_config(None)` is a
`Config()` with the environment's overrides applied, so `trainsentry run`
without a config file behaves as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainsentry.alerts.route import (
    GROUP_INTERVAL_SECONDS,
    GROUP_WAIT_SECONDS,
    RATE_LIMIT,
    REPEAT_INTERVAL_SECONDS,
    SEND_TIMEOUT_SECONDS,
    Route,
)
from trainsentry.config.schema import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT
from trainsentry.sources.shard import ALL, Shard


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where the HTTP API listens; `enabled` False when the address is `off`."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    enabled: bool = True
    token: str | None = field(default=None, repr=False)
    allow_unauthenticated: bool = False
    # The operator wrote the address (file or TRAINSENTRY_HTTP): a port already
    # in use is then an error; on the default address it is only a warning.
    explicit: bool = False

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `trainsentry run` needs beyond the command line.

    Command-line flags win over these (the CLI merges with `dataclasses.replace`).
    """

    source: Path | None = None  # the file it came from; None: embedded defaults
    watch: tuple[Path, ...] = ()  # log roots; empty: the command line's PATHs (or .)
    rules: tuple[str, ...] = ("default",)  # rule files/dirs in order; `default` = shipped pack
    state_dir: Path | None = None  # None: $TRAINSENTRY_STATE_DIR or the XDG state dir
    control_dir: Path | None = None  # stop files under here instead of the run directories
    poll: float | None = None  # seconds between sweeps; None: inotify (polling on network fs)
    history: float = 3600.0  # data older than this at startup notifies no one (inf: all)
    retention: int = 1000  # points per series kept at full resolution
    snapshot_interval: float = 60.0  # seconds between saves of the alert state
    shard: Shard = ALL
    link_template: str | None = None
    # the node ranks are labelled with on /metrics; None: the host the probe's meta record
    # names, else this host's name
    node: str | None = None
    # checkpoint names beside the frameworks' own, `{step}` where the step is
    # (sources/checkpoint_files.py)
    checkpoint_names: tuple[str, ...] = ()
    http: HttpSettings = field(default_factory=HttpSettings)
    routes: tuple[Route, ...] = field(default=(), repr=False)  # apprise and Alertmanager
    group_wait: float = GROUP_WAIT_SECONDS
    group_interval: float = GROUP_INTERVAL_SECONDS
    repeat_interval: float = REPEAT_INTERVAL_SECONDS
    rate_limit: tuple[int, float] | None = RATE_LIMIT
    notify_timeout: float = SEND_TIMEOUT_SECONDS

    def describe(self) -> str:
        """One line for the startup log, with no secret in it (so no URL either)."""
        parts = [f"config {self.source}" if self.source else "no config file"]
        if self.shard.count > 1:
            parts.append(f"shard {self.shard}")
        parts.append(f"http {self.http.address}" if self.http.enabled else "http off")
        if self.routes:
            kinds = sorted({r.kind for r in self.routes})
            counts = ", ".join(f"{sum(r.kind == k for r in self.routes)} {k}" for k in kinds)
            parts.append(f"{len(self.routes)} notification route(s) ({counts})")
        return "; ".join(parts)
