"""Tag and run names as writers and directories spell them, made safe to show and match.

A name travels to terminals, logs, alert lines, environment variables of
command actions and HTTP documents. A control character in it (a NUL in a
metric name, a newline or an ANSI escape in a run directory's name) would
split an alert line, colour a terminal or break an `execve`; so control
characters are written as `\\xNN` escapes, once, where a name is first read.
A name longer than MAX_NAME characters (a tag that is a whole document) is
cut to its first characters and a digest of the rest, so distinct names stay
distinct and every later stage (glob matching, the store's keys, messages)
works on a bounded string; each cut is counted (`cut_names`).
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 256  # characters; TensorBoard shows about 80, a deep per-layer tag is ~150
_KEEP = MAX_NAME - 17  # room for "…" and a 16-digit digest
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

cut_names = 0  # names shortened since the process began (/metrics)


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def safe_name(name: str) -> str:
    """`name` with control characters escaped and at most MAX_NAME characters long."""
    global cut_names
    if _CONTROL.search(name) is not None:
        name = _CONTROL.sub(_escape, name)
    if len(name) > MAX_NAME:
        cut_names += 1
        digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8)
        name = f"{name[:_KEEP]}…{digest.hexdigest()}"
    return name


def excerpt(text: str, limit: int = 40) -> str:
    """A short, escaped piece of a bad record for a message: never more of what was read."""
    shown = text if len(text) <= limit else text[:limit] + "..."
    return repr(shown)
