"""Real local endpoints for the notification tests: an HTTP receiver and an SMTP server.

Everything listens on 127.0.0.1 on a port the OS picks. Tests wait on what a
receiver got with `wait_for` (a condition variable), never by sleeping.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.ports import free_port

WAIT = 30.0  # generous: a failure shows as a timeout, success returns at once


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    """Records every POST; answers `status` (a code, or a function of the request) with
    `reply` (Slack's webhook answers `ok`, and apprise reads anything else as a failure)."""

    status: int | Callable[[Request], int] = 200
    reply: bytes = b"{}"
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._changed = threading.Condition()
        self.release = threading.Event()  # for `hold`: answers wait for this
        self.hold = False
        self.held = threading.Event()  # set when a request is being held
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                req = Request(self.path, dict(self.headers), self.rfile.read(length), 0)
                if receiver.hold:
                    receiver.held.set()
                    receiver.release.wait(WAIT)
                status = receiver.status(req) if callable(receiver.status) else receiver.status
                req.status = status
                with receiver._changed:  # recorded before answering: the sender returns after
                    receiver.requests.append(req)
                    receiver._changed.notify_all()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(receiver.reply)))
                    self.end_headers()
                    self.wfile.write(receiver.reply)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accepted(self) -> list[Request]:
        with self._changed:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait_for(self, test: Callable[[list[Request]], bool], timeout: float = WAIT) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: test(self.requests), timeout)

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1: keeps every mail it gets, parsed."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.mails: list[Message] = []
        self._changed = threading.Condition()
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                with outer._changed:
                    outer.mails.append(message_from_bytes(envelope.original_content))
                    outer._changed.notify_all()
                return "250 OK"

        self.port = free_port()  # aiosmtpd checks its server by connecting to the port it was given
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self._controller.start()

    def wait_for(self, n: int, timeout: float = WAIT) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self.mails) >= n, timeout)

    def close(self) -> None:
        self._controller.stop()
