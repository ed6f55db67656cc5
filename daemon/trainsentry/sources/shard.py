"""`--shard i/n`: n daemons share one huge log root, each owning a fixed part of the runs.

A run must be owned by exactly one daemon, and every daemon must agree on
which one without talking to the others, so ownership is a pure function of
the run id (its path relative to the watched root, the same on every host
that mounts the root anywhere). Python's `hash()` is salted per process and
would give every daemon a different answer; sha256 gives the same answer on
every host, Python version and restart.

Ownership uses rendezvous (highest random weight) hashing rather than
`hash % n`: when the fleet grows from n to n+1 daemons only about 1/(n+1) of
the runs move to the new daemon, instead of nearly all of them changing
hands. A run that changes hands is read from the start by its new owner
(whose state database has no offset for it), which is a backfill — with the
history horizon, no alert is re-sent for old data — so fewer moves means less
work and fewer surprises. The cost, n hashes per run, is paid once when a run
is discovered.

Shards are numbered 1..n, as `--shard` is in pytest-shard, Jest and Playwright.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

SHARD_HELP = "expected `i/n` with 1 <= i <= n, like `1/4`"
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
MAX_SHARDS = 4096  # a typo such as `1/40000` should be an error, not 40,000 hashes per run


class ShardError(ValueError):
    """A `--shard` value that names no shard; the message says what was expected."""


def _weight(run: str, index: int) -> int:
    digest = hashlib.sha256(f"{index}\0{run}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


def shard_of(run: str, count: int) -> int:
    """The shard (1..count) that owns `run`: the same on every host, forever.

    Changing this function moves runs between daemons on upgrade; a test pins
    known answers so that cannot happen by accident.
    """
    if count < 1:
        raise ShardError(f"a shard count must be at least 1, got {count}")
    if count == 1:
        return 1
    return max(range(1, count + 1), key=lambda i: _weight(run, i))


@dataclass(frozen=True, slots=True)
class Shard:
    """This daemon's part of the runs: shard `index` of `count` (1-based)."""

    index: int = 1
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ShardError(f"{SHARD_HELP}; the count must be 1..{MAX_SHARDS}, got {self.count}")
        if not 1 <= self.index <= self.count:
            raise ShardError(
                f"{SHARD_HELP}; shard {self.index} of {self.count} does not exist "
                f"(shards are numbered 1..{self.count})"
            )

    @property
    def everything(self) -> bool:
        """True when this daemon owns every run (no sharding)."""
        return self.count == 1

    def owns(self, run: str) -> bool:
        return self.count == 1 or shard_of(run, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


ALL = Shard(1, 1)


def parse_shard(text: str) -> Shard:
    """`"2/4"` → Shard(2, 4); raises ShardError saying what was expected."""
    match = _SHARD.match(str(text))
    if match is None:
        raise ShardError(f"{SHARD_HELP}, got {text!r}")
    return Shard(int(match.group(1)), int(match.group(2)))
