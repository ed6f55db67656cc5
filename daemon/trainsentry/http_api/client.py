"""`trainsentry status`'s client: the running daemon's runs and alerts, asked over HTTP.

The client asks the daemon over its HTTP API rather than opening the state
database: the daemon is the only one that knows what is in memory (last
steps, firing alerts), the database may sit in a StateDirectory the operator
cannot read, and the same command works against a daemon in a container or
on another node.

What it prints is terminal/plain.py's (plain lines) or terminal/render.py's (rich).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from trainsentry.http_api.address import DEFAULT_HOST, DEFAULT_PORT


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
                "set TRAINSENTRY_HTTP_TOKEN to the daemon's token"
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
