"""Where the HTTP API listens by default, and which addresses only this machine reaches.

Shared by the server (which refuses to expose run data without a token), the
config (which checks the same before anything starts) and `status` (which
must find the daemon where it listens by default).
"""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9465  # next to the exporters' range; prometheus.yml in deploy/ scrapes it


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
