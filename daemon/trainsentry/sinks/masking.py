"""Notification URLs as logs and screens may show them: their secrets hidden.

A notification URL is a credential (a Slack webhook's path, a password, a
token in the query), and it passes through logs, `notify-test`, the demo and
error messages. Every place that shows one asks here, so there is one idea of
what is secret.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from trainsentry.sources.secrets import mask_secrets

__all__ = ["mask_secrets", "mask_url", "scheme_only"]  # mask_secrets: for text log lines


def scheme_only(url: str, rest: str = "…") -> str:
    """`slack://…`: for places that need to say which service, never which account."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}://{rest}" if sep else "<url>"


# Generic webhooks, and Alertmanager behind a proxy: anything in their path may be the
# secret (`/hook/hooksecretpath`), and nothing in it tells which part
_PATH_IS_SECRET = frozenset({"json", "jsons", "xml", "xmls", "form", "forms", "http", "https"})


def mask_url(url: str) -> str:
    """A URL fit for logs: password, path and query hidden where they may hold secrets.

    Applied on top of apprise's own privacy form (`url(privacy=True)`), which
    masks each service's known secrets but shows a generic webhook's path, and
    a path is where many webhooks keep their token: so a generic webhook's
    every path segment is hidden, and elsewhere every token-like one.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "****"
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}:****@{host}" if ":" in user else f"****@{host}"
    generic = parts.scheme.lower() in _PATH_IS_SECRET
    path = "/".join(
        "****"
        if seg and "*" not in seg and (generic or (len(seg) >= 12 and re.search(r"\d", seg)))
        else seg
        for seg in parts.path.split("/")
    )
    return urlunsplit((parts.scheme, netloc, path, "…" if parts.query else "", ""))
