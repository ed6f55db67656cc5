"""The config file as pydantic sees it: shapes, units and secrets, checked at the boundary.

Like the rule schema, every model forbids unknown keys (a misspelt
`repeat_interval` must not silently keep the default) and every value parser
says what it expected. Durations are seconds or `30s`/`5m`/`4h`/`2d`, the
words the rule files use.

Secrets are given as `url`, `url_env: NAME` or `url_file: /run/secrets/x`
(and `token`, `token_env`, `token_file` for the HTTP API), so a config file
can be committed and mounted while the secret comes from the environment or
a mounted secret. They are resolved during validation — an unset variable or
an unreadable file is an error at that key, in the same pass as every other
error — and kept in private attributes, never in an error message.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainsentry.alerts.route import ALERTMANAGER_RESEND_SECONDS
from trainsentry.http_api.address import DEFAULT_HOST, DEFAULT_PORT
from trainsentry.rules.model import Span
from trainsentry.rules.schema import Strict
from trainsentry.sources.checkpoint_files import MAX_NAMES, BadName, name_regex
from trainsentry.sources.shard import ALL, Shard, ShardError, parse_shard

DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT = DEFAULT_HOST, DEFAULT_PORT
DURATION_HELP = "seconds or a duration like `30s`, `5m`, `4h`, `2d`"
_OFF = frozenset({"off", "none", "no", "false", "disabled"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _is_off(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, str) and value.lower() in _OFF)


def seconds(value: Any) -> float:
    """A number of seconds, or a duration word; never negative."""
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HELP}, got {value!r}")
    if isinstance(value, (int, float)):
        amount = float(value)
    elif isinstance(value, str):
        try:
            span = Span.parse(value)
        except ValueError:
            raise ValueError(f"expected {DURATION_HELP}, got {value!r}") from None
        if span.unit == "points":
            raise ValueError(f"expected {DURATION_HELP}, got {value!r}")
        amount = span.amount  # a bare "30" parses as steps: here it means seconds
    else:
        raise ValueError(f"expected {DURATION_HELP}, got a {type(value).__name__}")
    if not amount >= 0 or math.isinf(amount):
        raise ValueError(f"expected {DURATION_HELP} >= 0, got {value!r}")
    return amount


def positive_seconds(value: Any) -> float:
    """A duration that must not be zero (a timeout)."""
    amount = seconds(value)
    if amount <= 0:
        raise ValueError(f"expected {DURATION_HELP} > 0, got {value!r}")
    return amount


def parse_poll(value: Any) -> float | None:
    if _is_off(value):
        return None
    amount = seconds(value)
    if amount <= 0:
        raise ValueError(f"expected {DURATION_HELP} > 0, or `off` to use inotify, got {value!r}")
    return amount


def parse_horizon(value: Any) -> float:
    if isinstance(value, str) and value.lower() in ("all", "inf", "forever"):
        return math.inf  # alert on all history at startup
    return seconds(value)


def parse_rate(value: Any) -> tuple[int, float] | None:
    if _is_off(value) or value == 0 or value == "0":
        return None
    help_ = "expected COUNT/DURATION like `10/10m`, or `off`"
    if not isinstance(value, str) or value.count("/") != 1:
        raise ValueError(f"{help_}, got {value!r}")
    count, period = value.split("/")
    if not count.strip().isdigit() or int(count) < 1:
        raise ValueError(f"{help_}; COUNT must be a whole number >= 1, got {count.strip()!r}")
    per = seconds(period.strip())
    if per <= 0:
        raise ValueError(f"{help_}; DURATION must be positive")
    return int(count), per


# The command line's flags for these keys (argparse dests) take what the file
# and the TRAINSENTRY_* variables take, through the same parsers (cli.py).
FLAG_PARSERS: dict[str, Callable[[Any], Any]] = {
    "history": parse_horizon,
    "poll": parse_poll,
    "group_wait": seconds,
    "group_interval": seconds,
    "repeat_interval": seconds,
    "rate_limit": parse_rate,
    "notify_timeout": positive_seconds,
}


def _address(value: Any) -> tuple[str, int] | None:
    """`HOST:PORT`, `[::1]:PORT`, `:PORT` (all interfaces), a bare port, or `off`."""
    if _is_off(value):
        return None
    help_ = "expected HOST:PORT like `127.0.0.1:9465`, a port, or `off`"
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = DEFAULT_HTTP_HOST, text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{help_}; write an IPv6 address in brackets, `[{host}]:{port}`")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{help_}, got {value!r}")
    return host or "0.0.0.0", int(port)


def _shard(value: Any) -> Shard:
    if value is None:
        return ALL
    try:
        return parse_shard(str(value))
    except ShardError as exc:
        raise ValueError(str(exc)) from None


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, (str, int, float)) else _none_is_empty(value, [])


def _none_is_empty(value: Any, empty: Any) -> Any:
    """`routes:` with every entry commented out is YAML null: read it as empty, not an error."""
    return empty if value is None else value


def _empty_list(value: Any) -> Any:
    return _none_is_empty(value, [])


def _empty_mapping(value: Any) -> Any:
    return _none_is_empty(value, {})


def _url_shorthand(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value


def _http_shorthand(value: Any) -> Any:
    if value is None:  # `http:` with its keys commented out
        return {}
    return value if isinstance(value, dict) else {"address": value}


Seconds = Annotated[float, BeforeValidator(seconds)]
PositiveSeconds = Annotated[float, BeforeValidator(positive_seconds)]
Poll = Annotated[float | None, BeforeValidator(parse_poll)]
Horizon = Annotated[float, BeforeValidator(parse_horizon)]
RateLimit = Annotated[tuple[int, float] | None, BeforeValidator(parse_rate)]
Address = Annotated[tuple[str, int] | None, BeforeValidator(_address)]
ShardField = Annotated[Shard, BeforeValidator(_shard)]
Paths = Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_one_or_many)]


def _environ(info: ValidationInfo) -> Mapping[str, str]:
    ctx = info.context or {}
    env: Mapping[str, str] = ctx.get("environ", os.environ)
    return env


def _base(info: ValidationInfo) -> Path:
    ctx = info.context or {}
    base: Path = ctx.get("base", Path.cwd())
    return base


def _from_env(name: str, info: ValidationInfo) -> str:
    if not _ENV_NAME.match(name):
        raise ValueError(f"expected the name of an environment variable, got {name!r}")
    value = _environ(info).get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set (or empty)")
    return value


def _from_file(path: str, info: ValidationInfo) -> str:
    full = _base(info) / Path(path).expanduser()
    try:
        value = full.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {full}: {getattr(exc, 'strerror', None) or exc}") from None
    if not value:
        raise ValueError(f"{full} is empty")
    return value


class _Secret(Strict):
    """A value given inline, by environment variable name, or by file (one of the three).

    The `*_env` and `*_file` keys are checked by field validators, so an unset
    variable is reported at that key; the model validator then takes the value.
    """

    _secret: str | None = PrivateAttr(default=None)
    _keys: ClassVar[tuple[str, str, str]] = ("url", "url_env", "url_file")

    @field_validator("url_env", "token_env", check_fields=False)
    @classmethod
    def _env_is_set(cls, name: str | None, info: ValidationInfo) -> str | None:
        if name is not None:
            _from_env(name, info)
        return name

    @field_validator("url_file", "token_file", check_fields=False)
    @classmethod
    def _file_is_readable(cls, path: str | None, info: ValidationInfo) -> str | None:
        if path is not None:
            _from_file(path, info)
        return path

    def _resolve(self, info: ValidationInfo, required: bool) -> None:
        inline, env, file = (getattr(self, k) for k in self._keys)
        given = [k for k, v in zip(self._keys, (inline, env, file), strict=True) if v is not None]
        if len(given) > 1:
            raise ValueError(f"give one of `{'`, `'.join(given)}`, not several")
        if not given and required:
            raise ValueError(f"give one of `{'`, `'.join(self._keys)}`")
        if inline is not None:
            self._secret = str(inline).strip()
        elif env is not None:
            self._secret = _from_env(env, info)
        elif file is not None:
            self._secret = _from_file(file, info)

    @property
    def secret(self) -> str | None:
        return self._secret


class _UrlSpec(_Secret):
    url: str | None = None
    url_env: str | None = None
    url_file: str | None = None

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> _UrlSpec:
        self._resolve(info, required=True)
        return self


class AlertmanagerSpec(_UrlSpec):
    # a firing alert is re-sent this often, valid for four times as long (Prometheus'
    # --rules.alert.resend-delay, a minute)
    resend_interval: PositiveSeconds = ALERTMANAGER_RESEND_SECONDS


class RouteSpec(_UrlSpec):
    severity: Literal["warning", "critical"] = "warning"  # the least severe it receives
    match: Annotated[dict[str, str], BeforeValidator(_empty_mapping)] = Field(
        default_factory=dict
    )  # rule labels that must all be equal
    group_wait: Seconds | None = None  # these default to notify's
    group_interval: Seconds | None = None
    repeat_interval: Seconds | None = None
    rate_limit: RateLimit = None
    batch: bool = True


class NotifySpec(Strict):
    routes: Annotated[
        list[Annotated[RouteSpec, BeforeValidator(_url_shorthand)]], BeforeValidator(_empty_list)
    ] = Field(default_factory=list)
    alertmanagers: Annotated[
        list[Annotated[AlertmanagerSpec, BeforeValidator(_url_shorthand)]],
        BeforeValidator(_empty_list),
    ] = Field(default_factory=list)
    group_wait: Seconds = 30.0
    group_interval: Seconds = 300.0
    repeat_interval: Seconds = 4 * 3600.0
    rate_limit: RateLimit = (10, 600.0)
    timeout: PositiveSeconds = 10.0


class HttpSpec(_Secret):
    address: Address = (DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT)
    token: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    allow_unauthenticated: bool = False
    _keys: ClassVar[tuple[str, str, str]] = ("token", "token_env", "token_file")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> HttpSpec:
        self._resolve(info, required=False)
        return self


class ConfigSpec(Strict):
    watch: Paths = Field(default_factory=list)
    rules: Paths = Field(default_factory=lambda: ["default"])
    state_dir: str | None = None
    control_dir: str | None = None
    poll: Poll = None
    history: Horizon = 3600.0
    retention: int = Field(default=1000, ge=1)
    snapshot_interval: Seconds = Field(default=60.0, gt=0)
    shard: ShardField = ALL
    link_template: str | None = None
    # the node this daemon runs beside, as /metrics labels the ranks it follows (a fleet's
    # Prometheus tells nodes apart by it); None: the host the probe names, else this host
    node: str | None = None
    # names of checkpoints beside the frameworks' own (sources/checkpoint_files.py):
    # `weights-{step}.bin`, `snapshot_*_{step}`
    checkpoint_names: Annotated[list[str], BeforeValidator(_empty_list)] = Field(
        default_factory=list, max_length=MAX_NAMES
    )
    http: Annotated[HttpSpec, BeforeValidator(_http_shorthand)] = Field(default_factory=HttpSpec)
    notify: Annotated[NotifySpec, BeforeValidator(_empty_mapping)] = Field(
        default_factory=NotifySpec
    )

    @field_validator("checkpoint_names")
    @classmethod
    def _step_in_names(cls, names: list[str]) -> list[str]:
        for name in names:
            try:
                name_regex(name)
            except BadName as exc:
                raise ValueError(
                    f"expected a checkpoint's name with `{{step}}` in it: {exc}"
                ) from None
        return names

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and (not 0 < len(value) <= 253 or any(c.isspace() for c in value)):
            raise ValueError(f"expected a node's name (a host name, no spaces), got {value!r}")
        return value
