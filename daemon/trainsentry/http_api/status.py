"""`trainsentry status`: the running daemon's runs and alerts as a terminal table.

The client asks the daemon over its HTTP API rather than opening the state
database: the daemon is the only one that knows what is in memory (last
steps, firing alerts), the database may sit in a StateDirectory the operator
cannot read, and the same command works against a daemon in a container or
on another node.

Rendering is a pure function of the two JSON documents, so it is tested
without a daemon; plain lines here pipe cleanly into grep and scripts, and
a terminal gets the rich table of sinks/console.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from trainsentry.http_api.server import DEFAULT_HOST, DEFAULT_PORT


class StatusError(Exception):
    """The daemon could not be asked; the message says why and what to check."""


def base_url(address: str) -> str:
    """`HOST:PORT`, `:PORT`, `HOST` or a full `http(s)://` URL → the API's base URL."""
    address = address.strip()
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or "]" in port:  # no port given ("localhost", "[::1]")
        host, port = address, str(DEFAULT_PORT)
    host = host or DEFAULT_HOST
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _get(url: str, token: str | None, timeout: float) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    # No proxy: cluster nodes often set http_proxy, and the daemon is local or on the LAN.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            hint = "a wrong token" if token else "no token given"
            raise StatusError(
                f"{url}: the daemon wants a bearer token ({hint}); "
                "set TRAINSENTRY_HTTP_TOKEN or pass --token"
            ) from None
        raise StatusError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = getattr(exc.reason, "strerror", None) or exc.reason
        raise StatusError(
            f"no trainsentry daemon answers at {url} ({reason}); is it running, "
            "and is its HTTP address (http.address in the config, --http) this one?"
        ) from None
    except (TimeoutError, OSError) as exc:
        raise StatusError(f"{url}: {exc}") from None
    except ValueError:
        raise StatusError(f"{url}: the answer is not JSON; is this a trainsentry daemon?") from None


def fetch_status(
    address: str, token: str | None = None, *, timeout: float = 5.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`/api/runs`, `/api/alerts`) of the daemon at `address`; raises StatusError."""
    base = base_url(address)
    return _get(f"{base}/api/runs", token, timeout), _get(f"{base}/api/alerts", token, timeout)


def format_age(seconds: float | None) -> str:
    """42s, 12m, 3h05m, 2d04h: precise when fresh, coarse when old."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def loaded(
    api_runs_json: Any, api_alerts_json: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs (sorted by name) and alerts of the documents as served, as text or parsed."""

    def items(doc: Any, key: str) -> list[dict[str, Any]]:
        if isinstance(doc, (str, bytes)):
            doc = json.loads(doc)
        found = doc.get(key, []) if isinstance(doc, dict) else doc
        return [x for x in found or [] if isinstance(x, dict)]

    runs = sorted(items(api_runs_json, "runs"), key=lambda r: str(r.get("run")))
    return runs, items(api_alerts_json, "alerts")


def summary_line(runs: Sequence[dict[str, Any]], alerts: Sequence[dict[str, Any]]) -> str:
    critical = sum(1 for a in alerts if a.get("severity") == "critical")
    summary = f"{len(runs)} run{'s' * (len(runs) != 1)}, {len(alerts)} firing"
    if alerts:
        summary += f" ({critical} critical, {len(alerts) - critical} warning)"
    return summary


def render_status(api_runs_json: Any, api_alerts_json: Any) -> str:
    """The runs table and the firing alerts' messages, as plain lines for pipes and scripts.

    One row per run, sorted by name; a run with several firing alerts gets one
    extra line per alert. (On a terminal, sinks/console.py draws the same.)
    """
    runs, alerts = loaded(api_runs_json, api_alerts_json)
    rows: list[tuple[str, str, str, str, str]] = []  # run, step, age, severity, what
    for r in runs:
        step = "-" if r.get("last_step") is None else str(r["last_step"])
        age = format_age(r.get("age_seconds"))
        firing = r.get("firing") or []
        if not firing:
            rows.append((str(r.get("run")), step, age, "", "-"))
        for i, a in enumerate(firing):
            what = f"{a.get('rule')} ({a.get('metric')})"
            cells = (str(r.get("run")), step, age) if i == 0 else ("", "", "")
            rows.append((*cells, str(a.get("severity", "")), what))
    header = ("RUN", "STEP", "AGE", "FIRING")
    w_run = max([len(header[0])] + [len(row[0]) for row in rows])
    w_step = max([len(header[1])] + [len(row[1]) for row in rows])
    w_age = max([len(header[2])] + [len(row[2]) for row in rows])
    lines = [f"{header[0]:<{w_run}}  {header[1]:>{w_step}}  {header[2]:>{w_age}}  {header[3]}"]
    for run, step, age, severity, what in rows:
        rest = f"{severity} {what}" if severity else what
        lines.append(f"{run:<{w_run}}  {step:>{w_step}}  {age:>{w_age}}  {rest}")
    lines.append(summary_line(runs, alerts))
    if alerts:
        lines.append("")
        for a in alerts:
            severity = str(a.get("severity", ""))
            message = " ".join(str(a.get("message", "")).split())
            lines.append(f"{severity:<8}  {a.get('run')}  {a.get('rule')}: {message}")
    return "\n".join(lines) + "\n"
