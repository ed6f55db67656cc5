"""Makes `support` importable from every test folder, whatever pytest's import mode.

The tests live in unit/<package>/ and e2e/, the helpers they share in
support/. In pytest's default "prepend" mode only each test file's own folder
goes on sys.path, in "importlib" mode none does; so this file puts tests/ there
itself, and `from support.daemon_process import DaemonProcess` works from any
folder. `support` is a package rather than a folder on sys.path so that every
import names where its helper lives, and a helper's name cannot clash with an
installed module.

The test folders have no __init__.py (a test is collected by its file name
alone), which is why test file names must be unique across all of them.

The support modules' asserts are rewritten as the tests' are, so a helper's
failed check shows its values too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

pytest.register_assert_rewrite("support")


@pytest.fixture(scope="session")
def tracker_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tracker's store as the real package wrote it (support/trackers.py's KINDS), once
    a session: MLflow's SQLite store alone takes ~20 s to migrate. Read-only: a test that
    changes one copies it first."""
    from support.trackers import write_all

    return write_all(tmp_path_factory.mktemp("trackers"))


@pytest.fixture(scope="session")
def mlflow_db_written(tracker_stores: dict[str, Path]) -> Path:
    """An mlflow.db the real MLflow wrote (runs "healthy" and "diverge" of exp1)."""
    return tracker_stores["mlflow-sqlite"] / "mlflow.db"
