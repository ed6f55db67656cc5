"""Notification URLs as logs and screens may show them: their secrets hidden.

A notification URL is a credential (a Slack webhook's path, a password, a
token in the query), and it passes through logs, `notify-test`, the demo and
error messages. Every place that shows one asks here, so there is one idea of
what is secret.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


def scheme_only(url: str, rest: str = "…") -> str:
    """`slack://…`: for places that need to say which service, never which account."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}://{rest}" if sep else "<url>"


def mask_url(url: str) -> str:
    """A URL fit for logs: password, token-like path segments and the query hidden.

    Applied on top of apprise's own privacy form (`url(privacy=True)`), which
    masks each service's known secrets but shows a generic webhook's path, and
    a path is where many webhooks keep their token.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "****"
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}:****@{host}" if ":" in user else f"****@{host}"
    path = "/".join(
        "****" if len(seg) >= 12 and re.search(r"\d", seg) and "*" not in seg else seg
        for seg in parts.path.split("/")
    )
    return urlunsplit((parts.scheme, netloc, path, "…" if parts.query else "", ""))
