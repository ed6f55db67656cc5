"""What `trainsentry test` prints and returns: quiet on success, a diff per failing case.

Exit status 1 when any case fails or any test file cannot be read (its errors
are printed as file:line:col lines and the other files still run), so one CI
step can run a whole directory of tests and show every problem at once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from trainsentry.ruletest.junit import FileOutcome, write_junit
from trainsentry.ruletest.runner import CaseResult, run_file
from trainsentry.ruletest.spec import TestFileError, load_test_file


def expand(paths: list[str]) -> list[Path]:
    """Directories become the *.yaml / *.yml files under them, sorted."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml")))
        else:
            out.append(path)
    return out


def _print_failure(result: CaseResult, out: TextIO) -> None:
    out.write(f"FAIL  {result.where}  {result.name}\n")
    for block in result.failures:
        out.write("  " + block.replace("\n", "\n  ") + "\n")
    out.write("\n")


def run_tests(
    paths: list[str],
    *,
    out: TextIO,
    junit: Path | None = None,
    select: str | None = None,
    verbose: bool = False,
) -> int:
    started = time.monotonic()
    outcomes: list[FileOutcome] = []
    for path in expand(paths):
        try:
            test_file = load_test_file(path)
        except TestFileError as exc:
            out.write("\n".join(exc.errors) + "\n")
            out.write(f"ERROR {path}: {len(exc.errors)} error(s); its tests were not run\n\n")
            outcomes.append((str(path), [], exc.errors))
            continue
        results = run_file(test_file, select)
        for result in results:
            if not result.passed:
                _print_failure(result, out)
            elif verbose:
                out.write(f"ok    {result.where}  {result.name}\n")
        outcomes.append((str(path), results, []))
    passed = sum(r.passed for _, results, _ in outcomes for r in results)
    failed = sum(not r.passed for _, results, _ in outcomes for r in results)
    broken = sum(1 for _, _, errors in outcomes if errors)
    summary = f"{passed} passed, {failed} failed"
    if broken:
        summary += f", {broken} file(s) with errors"
    seconds = time.monotonic() - started
    out.write(f"trainsentry test: {summary} in {len(outcomes)} file(s) ({seconds:.1f}s)\n")
    if junit is not None:
        write_junit(outcomes, junit)
    if not outcomes or (passed + failed == 0 and not broken):
        out.write("trainsentry test: no test cases ran\n")
        return 1
    return 1 if failed or broken else 0
