"""Where the repository's files are, for tests that read them or run a support script by path.

Kept in one place so that moving a test between folders never changes what
it finds: every path is counted from this file, not from the test's own.
"""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
