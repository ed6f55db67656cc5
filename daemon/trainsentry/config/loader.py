"""One YAML file → `Config`, with every error at file:line:col, and the environment on top.

The YAML is read by the rule loader's machinery (`trainsentry.rules.loader`:
YAML 1.2 scalars, a mark for every key and value, pydantic's error wording),
so a config file and a rule file report mistakes the same way: all at once,
`file:line:col: `key`: what was expected`, unknown keys with "did you mean".

Three layers, later wins:

1. the file (or the embedded defaults when there is none);
2. `${NAME}`, `${NAME:-default}` and `${NAME-default}` inside string values,
   expanded from the environment (`$$` is a literal `$`) — for values that
   differ per host or container but sit in the middle of a string;
3. `TRAINSENTRY_*` variables (ENV_OVERRIDES) replacing whole keys — what a
   container or a systemd `Environment=` line sets without editing the file.
   Their errors name the variable instead of a line.

Relative paths in the file are relative to the file's directory (the file
and its rule files move together); paths from the environment are relative
to the working directory, as on a command line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainsentry.alerts.route import Route, RouteError, parse_alertmanager, parse_notify
from trainsentry.config.model import Config, HttpSettings
from trainsentry.config.schema import ConfigSpec
from trainsentry.http_api.address import is_loopback
from trainsentry.rules.marked_yaml import MarkedDocument, YamlPath, problems, read_mapping

# variable → (key path, how its text becomes a value)
ENV_OVERRIDES: dict[str, tuple[tuple[str, ...], str]] = {
    "TRAINSENTRY_WATCH": (("watch",), "paths"),  # os.pathsep-separated
    "TRAINSENTRY_RULES": (("rules",), "paths"),
    "TRAINSENTRY_STATE_DIR": (("state_dir",), "path"),
    "TRAINSENTRY_CONTROL_DIR": (("control_dir",), "path"),
    "TRAINSENTRY_POLL": (("poll",), "text"),
    "TRAINSENTRY_HISTORY": (("history",), "text"),
    "TRAINSENTRY_RETENTION": (("retention",), "text"),
    "TRAINSENTRY_SNAPSHOT_INTERVAL": (("snapshot_interval",), "text"),
    "TRAINSENTRY_SHARD": (("shard",), "text"),
    "TRAINSENTRY_LINK_TEMPLATE": (("link_template",), "text"),
    "TRAINSENTRY_NODE": (("node",), "text"),
    "TRAINSENTRY_HTTP": (("http", "address"), "text"),
    "TRAINSENTRY_HTTP_TOKEN": (("http", "token"), "secret"),
}
_EXPAND = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


class ConfigError(Exception):
    """Raised with every problem found, each "file:line:col: message" (or naming a variable)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def _key(path: YamlPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class _Reader:
    """One load: the document's marks, the variables that replaced keys, the errors."""

    def __init__(self, name: str, environ: Mapping[str, str]) -> None:
        self.doc = MarkedDocument(name)
        self.environ = environ
        self.env_paths: dict[YamlPath, str] = {}  # key path → the variable that set it
        self.env_errors: list[str] = []

    def error(self, path: YamlPath, message: str, *, at_key: bool = False) -> None:
        """Report at the variable that set `path` (or a parent), else at its mark in the file."""
        for i in range(len(path), 0, -1):
            var = self.env_paths.get(path[:i])
            if var is not None:
                self.env_errors.append(f"environment variable {var}: {message}")
                return
        marks = (self.doc.keys, self.doc.values) if at_key else (self.doc.values, self.doc.keys)
        known = path
        while known and known not in marks[0] and known not in marks[1]:
            known = known[:-1]
        self.doc.error(marks[0].get(known) or marks[1].get(known), message)

    def errors(self) -> list[str]:
        return self.env_errors + self.doc.rendered()

    # -- layer 1: the file ----------------------------------------------------

    def parse(self, text: str) -> dict[str, Any]:
        expected = "a mapping of settings (`watch:`, `rules:` ...)"
        return read_mapping(text, self.doc, "config file", expected) or {}

    # -- layer 2: ${NAME} inside values -----------------------------------------

    def expand(self, value: Any, path: YamlPath) -> Any:
        if isinstance(value, dict):
            return {k: self.expand(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v, (*path, i)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value

        def one(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, op, default = match.group(1), match.group(2), match.group(3)
            got = self.environ.get(name)
            if op == ":-" and not got:
                return default or ""
            if op == "-" and got is None:
                return default or ""
            if got is None:
                self.error(
                    path,
                    f"`{_key(path)}`: environment variable {name} is not set "
                    f"(write `${{{name}:-default}}` to give a default)",
                )
                return ""
            return got

        return _EXPAND.sub(one, value)

    # -- layer 3: TRAINSENTRY_* replacing keys ----------------------------------

    def override(self, data: dict[str, Any]) -> None:
        for var, (path, kind) in ENV_OVERRIDES.items():
            text = self.environ.get(var)
            if text is None or text == "":
                continue
            value: Any = text
            if kind == "paths":
                value = [_cwd_path(p) for p in text.split(os.pathsep) if p]
            elif kind == "path":
                value = _cwd_path(text)
            *parents, last = path
            target = data
            for part in parents:
                child = target.get(part)
                if child is None or isinstance(child, (str, int)) or child is False:
                    # `http: 0.0.0.0:9465` shorthand: keep it as the address
                    child = {} if child is None else {"address": child}
                if not isinstance(child, dict):
                    break
                target[part] = child
                target = child
            else:
                if kind == "secret":  # the variable replaces token_env / token_file too
                    for sibling in ("token_env", "token_file"):
                        target.pop(sibling, None)
                target[last] = value
                self.env_paths[path] = var

    # -- pydantic, errors mapped back ------------------------------------------

    def validate(self, data: dict[str, Any], base: Path) -> ConfigSpec | None:
        context = {"environ": self.environ, "base": base}
        try:
            return ConfigSpec.model_validate(data, context=context)
        except ValidationError as exc:
            self.report(exc)
            return None

    def report(self, exc: ValidationError) -> None:
        """The errors at the key paths they name (`notify.routes[1].url`), since a value
        may come from a variable rather than the file."""
        seen: set[YamlPath] = set()
        for p in problems(exc, ConfigSpec):
            if p.kind == "unknown":
                self.error(p.loc, f"unknown key `{_key(p.loc)}`; {p.text}", at_key=True)
                continue
            if p.kind == "missing":
                self.error(p.loc, f"missing required key `{_key((*p.loc, p.key))}`")
                continue
            # union branches append names like 'tuple[str, int]': cut back to a real key
            known = p.loc
            while known and known not in self.doc.values and known not in self.doc.keys:
                if known in self.env_paths:
                    break
                known = known[:-1]
            if known in seen:
                continue
            seen.add(known)
            self.error(known, f"`{_key(known)}`: {p.text}")


def _cwd_path(text: str) -> str:
    return text if text == "default" else str(Path(text).expanduser().absolute())


def _path(base: Path, text: str) -> Path:
    return base / Path(text).expanduser()  # an absolute `text` replaces `base`


def _routes(spec: ConfigSpec, reader: _Reader) -> tuple[Route, ...]:
    notify = spec.notify
    routes: list[Route] = []
    first_at: dict[str, str] = {}  # receiver → the key that named it first

    def add(route: Route, path: YamlPath) -> None:
        first = first_at.setdefault(route.receiver, _key(path))
        if first != _key(path):
            reader.error(path, f"`{_key(path)}`: the same notification URL as `{first}`")
        else:
            routes.append(route)

    for i, r in enumerate(notify.routes):
        path: YamlPath = ("notify", "routes", i)
        timing: dict[str, Any] = {
            "group_wait": notify.group_wait if r.group_wait is None else r.group_wait,
            "group_interval": (
                notify.group_interval if r.group_interval is None else r.group_interval
            ),
            "repeat_interval": (
                notify.repeat_interval if r.repeat_interval is None else r.repeat_interval
            ),
            "rate_limit": r.rate_limit if "rate_limit" in r.model_fields_set else notify.rate_limit,
            "timeout": notify.timeout,
        }
        try:
            route = parse_notify(r.secret or "", **timing)
        except RouteError as exc:  # its message masks the URL
            reader.error(path, f"`{_key(path)}`: {exc}")
            continue
        severity = r.severity if "severity" in r.model_fields_set else route.min_severity
        labels = tuple(sorted(r.match.items()))
        add(replace(route, min_severity=severity, match_labels=labels, batch=r.batch), path)
    for i, a in enumerate(notify.alertmanagers):
        path = ("notify", "alertmanagers", i)
        try:
            add(parse_alertmanager(a.secret or "", notify.timeout, a.resend_interval), path)
        except RouteError as exc:
            reader.error(path, f"`{_key(path)}`: {exc}")
    return tuple(routes)


def _http(spec: ConfigSpec, reader: _Reader, data: dict[str, Any]) -> HttpSettings:
    h = spec.http
    raw = data.get("http")
    # an address written down (`http: HOST:PORT`, `http: {address: ...}`, TRAINSENTRY_HTTP)
    # is one the operator wants: busy, it stops the start instead of being skipped
    explicit = ("http", "address") in reader.env_paths or (
        "address" in raw if isinstance(raw, dict) else raw is not None
    )
    if h.address is None:
        return HttpSettings(enabled=False, explicit=explicit)
    host, port = h.address
    token = h.secret or None
    if not (token or h.allow_unauthenticated or is_loopback(host)):
        path: YamlPath = ("http", "address")
        reader.error(
            path,
            f"`http.address`: {host}:{port} serves run names, values and alert messages "
            "to the network; set `http.token` (or `token_env`, `token_file`, "
            "TRAINSENTRY_HTTP_TOKEN), or `http.allow_unauthenticated: true` on a trusted network",
        )
    return HttpSettings(host, port, True, token, h.allow_unauthenticated, explicit)


def load_config(path: str | Path | None, *, environ: Mapping[str, str] | None = None) -> Config:
    """The file at `path` (None: embedded defaults) with the environment applied.

    Raises ConfigError listing every problem; nothing is half-applied.
    """
    env = os.environ if environ is None else environ
    name = str(path) if path is not None else "<defaults>"
    reader = _Reader(name, env)
    base = Path.cwd()
    data: dict[str, Any] = {}
    if path is not None:
        source = Path(path)
        base = source.absolute().parent
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                [f"{name}:1:1: cannot read: {getattr(exc, 'strerror', None) or exc}"]
            ) from None
        data = reader.expand(reader.parse(text), ())
    reader.override(data)
    spec = reader.validate(data, base)
    if spec is None:
        raise ConfigError(reader.errors())
    config = Config(
        source=Path(path).absolute() if path is not None else None,
        watch=tuple(_path(base, p) for p in spec.watch),
        rules=tuple(p if p == "default" else str(_path(base, p)) for p in spec.rules),
        state_dir=_path(base, spec.state_dir) if spec.state_dir else None,
        control_dir=_path(base, spec.control_dir) if spec.control_dir else None,
        poll=spec.poll,
        history=spec.history,
        retention=spec.retention,
        snapshot_interval=spec.snapshot_interval,
        shard=spec.shard,
        link_template=spec.link_template,
        node=spec.node,
        checkpoint_names=tuple(spec.checkpoint_names),
        http=_http(spec, reader, data),
        routes=_routes(spec, reader),
        group_wait=spec.notify.group_wait,
        group_interval=spec.notify.group_interval,
        repeat_interval=spec.notify.repeat_interval,
        rate_limit=spec.notify.rate_limit,
        notify_timeout=spec.notify.timeout,
    )
    errors = reader.errors()
    if errors:
        raise ConfigError(errors)
    return config
