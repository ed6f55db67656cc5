"""The daemon's HTTP endpoint: /metrics, /healthz, /api/runs, /api/alerts, in one thread.

The standard library's ThreadingHTTPServer is enough: a handful of scrapes
and `trainsentry status` calls a minute, each answered from a published
snapshot without touching the main loop (view.py says why). No framework,
no extra dependency beyond prometheus-client's text format.

Safe by default: it binds 127.0.0.1. Binding any other address exposes run
names, metric values and alert messages to the network, so it is refused
without a bearer token unless the operator says `allow_unauthenticated` —
a decision made once, in writing, not by accident. `/healthz` is always open:
it reveals only whether the loop is alive, and a container's HEALTHCHECK or a
load balancer should not need the token.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder

from trainsentry.http_api.address import DEFAULT_HOST, DEFAULT_PORT, is_loopback
from trainsentry.http_api.metrics import make_registry
from trainsentry.http_api.view import DaemonView, alerts_document, runs_document

log = logging.getLogger(__name__)


class HttpApiError(ValueError):
    """The server cannot start as configured; the message says what to change."""


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool) -> None:
    """Refuse to serve run data to the network without a token, unless explicitly allowed."""
    if token or allow_unauthenticated or is_loopback(host):
        return
    raise HttpApiError(
        f"refusing to serve the HTTP API on {host or 'all interfaces'} without a bearer token: "
        "set http.token (or TRAINSENTRY_HTTP_TOKEN), bind 127.0.0.1, "
        "or set http.allow_unauthenticated: true if the network is trusted"
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client never holds up shutdown
    allow_reuse_port = False  # a second daemon on the same port must fail, not share it
    view: DaemonView
    token: str | None
    registry: Any
    clock: Callable[[], float]


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # seconds a client may take to send its request
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/healthz":
            self._healthz()
            return
        if not self._authorized():
            return
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.server.registry), content_type)
        elif path == "/api/runs":
            self._json(200, runs_document(self.server.view.snapshot(), self.server.clock()))
        elif path == "/api/alerts":
            view = self.server.view
            doc = alerts_document(view.snapshot(), self.server.clock(), view.notification_counts())
            self._json(200, doc)
        elif path == "/":
            self._json(200, {"endpoints": ["/metrics", "/healthz", "/api/runs", "/api/alerts"]})
        else:
            self._json(404, {"error": f"no such endpoint: {path}"})

    do_HEAD = do_GET  # _send leaves the body out

    def _not_allowed(self) -> None:
        self._json(405, {"error": "read-only API: use GET"}, {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_allowed

    def _healthz(self) -> None:
        view = self.server.view
        age, limit = view.heartbeat_age(), view.heartbeat_limit()
        ok = age <= limit
        body = {
            "status": "ok" if ok else "stuck",
            "last_cycle_age_seconds": round(age, 3),
            "limit_seconds": limit,
        }
        if not ok:
            body["error"] = f"the main loop has not completed a cycle for {age:.0f}s"
        self._json(200 if ok else 503, body)

    def _authorized(self) -> bool:
        token = self.server.token
        if not token:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), token.encode()
        ):
            return True
        self._json(
            401,
            {"error": "a bearer token is required (Authorization: Bearer <token>)"},
            {"WWW-Authenticate": 'Bearer realm="trainsentry"'},
        )
        return False

    def _json(self, status: int, doc: object, headers: dict[str, str] | None = None) -> None:
        body = (json.dumps(doc, allow_nan=False) + "\n").encode()
        self._send(status, body, "application/json", headers)

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s - %s", self.address_string(), format % args)


class ApiServer:
    """`ApiServer(view, host, port, token=...)`, then `start()` and `close()`.

    Port 0 picks a free port (tests); `port` tells which. Raises HttpApiError
    when the address is exposed without a token, or cannot be bound.
    """

    def __init__(
        self,
        view: DaemonView,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        allow_unauthenticated: bool = False,
        clock: Callable[[], float] = time.time,
        poll_interval: float = 0.5,
    ) -> None:
        check_exposure(host, token, allow_unauthenticated)
        bind_host = host.strip("[]")
        server_class = _Server6 if ":" in bind_host else _Server
        try:
            self._httpd = server_class((bind_host, port), _Handler)
        except OSError as exc:
            raise HttpApiError(
                f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}; is another "
                "trainsentry running? Give a free HOST:PORT (--http, http.address) or --http off"
            ) from None
        self._httpd.view = view
        self._httpd.token = token or None
        self._httpd.registry = make_registry(view, clock=clock)
        self._httpd.clock = clock
        self._poll_interval = poll_interval  # how long close() may wait for the loop to notice
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": self._poll_interval},
            name="http-api",
            daemon=True,
        )
        self._thread.start()
        log.info("HTTP API on %s", self.url)

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
