"""A free TCP port on 127.0.0.1, for a server a test starts or tells a process to start.

The OS picks it, so tests that run at the same time never ask for the same one.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
