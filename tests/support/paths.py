"""Where the repository's files are, for tests that read them or run a support script by path.

Kept in one place so that moving a test between folders never changes what
it finds: every path is counted from this file, not from the test's own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]


def bench_module(name: str, file: str) -> ModuleType:
    """A bench script imported by path as `name` (bench/ is scripts, not a package);
    registered in sys.modules so its dataclasses can find their module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
