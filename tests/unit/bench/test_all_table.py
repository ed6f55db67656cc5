"""bench/all.py: the table it writes replaces only its marked section, and a bench that
cannot run gives a row saying why instead of ending the run."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO, bench_module


def _all() -> ModuleType:
    return bench_module("bench_all", "all.py")


def test_write_replaces_the_marked_section_and_nothing_else(tmp_path: Path) -> None:
    bench = _all()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# before\n\n{bench.BEGIN}\nold table\n{bench.END}\n\n# after\n")
    rows = [bench.Row("W&B offline run", "1 k points/s", "parse loop: 2 k/s", "0.50×", "≥ 1×")]
    bench.write(doc, bench.table(rows))
    bench.write(doc, bench.table(rows))  # twice: the section is replaced, not appended to
    text = doc.read_text()
    assert "old table" not in text
    assert text.count("| W&B offline run | 1 k points/s |") == 1
    assert text.startswith("# before\n") and text.endswith("# after\n")


def test_write_without_markers_says_so(tmp_path: Path) -> None:
    bench = _all()
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match=re.escape("no '<!-- bench/all.py: begin -->'")):
        bench.write(doc, "table")
    assert doc.read_text() == "# no markers\n"


def test_the_repository_doc_has_the_markers() -> None:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    bench = _all()
    assert 0 <= text.find(bench.BEGIN) < text.find(bench.END)


def test_a_bench_that_fails_gives_a_row_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _all()
    # the trackers' bench as it ends where wandb is not installed
    monkeypatch.setattr(
        bench,
        "run",
        lambda script, args, timeout, wants_json=True: bench.Ran(
            None, "failed: ModuleNotFoundError: No module named 'wandb'", ""
        ),
    )
    rows = bench.tracker_rows(True, 10.0)
    assert [r.work for r in rows] == ["W&B offline run", "MLflow store (mlflow.db)"]
    assert all("No module named 'wandb'" in r.ours for r in rows)


def test_run_reports_a_crashing_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _all()
    (tmp_path / "broken.py").write_text("raise RuntimeError('peer not installed')\n")
    monkeypatch.setattr(bench, "BENCH", tmp_path)
    ran = bench.run("broken.py", [], timeout=60)
    assert ran.found is None
    assert ran.why == "failed: RuntimeError: peer not installed"
