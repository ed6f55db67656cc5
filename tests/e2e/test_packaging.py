"""Contracts of the distribution itself."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import trainsentry


def test_daemon_never_imports_torch_or_pandas() -> None:
    names = [
        m.name
        for m in pkgutil.walk_packages(trainsentry.__path__, "trainsentry.")
        if m.name != "trainsentry.__main__"  # runs the CLI on import
    ]
    assert "trainsentry.cli" in names and "trainsentry.sources.tail" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'pandas', 'tensorflow', 'jax') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_default_rule_pack_ships_inside_the_package() -> None:
    from importlib.resources import files

    assert (files("trainsentry") / "packs" / "default.yaml").is_file()


def test_cli_reports_a_missing_path_in_one_line(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trainsentry", "dump", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "no such file or directory" in out.stderr
