"""JUnit XML for rule tests, because that is the one report format every CI system shows.

One <testsuite> per test file, one <testcase> per case; a case that did not
match gets a <failure> with the same diff the terminal shows, and a test file
that could not be read gets one <error> case carrying its file:line:col lines,
so a broken file is red in CI rather than silently empty.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from trainsentry.ruletest.runner import CaseResult

FileOutcome = tuple[str, list[CaseResult], list[str]]  # path, case results, file errors


def write_junit(outcomes: list[FileOutcome], path: Path) -> None:
    root = ET.Element("testsuites", name="trainsentry test")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for file_path, results, errors in outcomes:
        failures = sum(1 for r in results if not r.passed)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=file_path,
            tests=str(len(results) + (1 if errors else 0)),
            failures=str(failures),
            errors=str(1 if errors else 0),
        )
        totals["tests"] += len(results) + (1 if errors else 0)
        totals["failures"] += failures
        totals["errors"] += 1 if errors else 0
        if errors:
            case = ET.SubElement(suite, "testcase", name="load", classname=file_path)
            err = ET.SubElement(case, "error", message=errors[0].splitlines()[0])
            err.text = "\n".join(errors)
        for result in results:
            case = ET.SubElement(
                suite, "testcase", name=result.name, classname=file_path, file=result.where
            )
            if not result.passed:
                failure = ET.SubElement(case, "failure", message=result.failures[0].splitlines()[0])
                failure.text = "\n\n".join(result.failures)
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
