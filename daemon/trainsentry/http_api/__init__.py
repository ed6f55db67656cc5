"""The daemon's HTTP API (server.py), what it reads of the daemon (view.py), and its client
for `trainsentry status` (status.py). /metrics itself is built in trainsentry.http_api.metrics."""

from trainsentry.http_api.address import is_loopback
from trainsentry.http_api.client import StatusError, fetch_status
from trainsentry.http_api.server import ApiServer, HttpApiError, check_exposure
from trainsentry.http_api.view import (
    DaemonSnapshot,
    DaemonView,
    LiveView,
    RunStatus,
    SnapshotBoard,
    runs_of_store,
)

__all__ = [
    "ApiServer",
    "DaemonSnapshot",
    "DaemonView",
    "HttpApiError",
    "LiveView",
    "RunStatus",
    "SnapshotBoard",
    "StatusError",
    "check_exposure",
    "fetch_status",
    "is_loopback",
    "runs_of_store",
]
