"""Needles: the literals a pattern cannot match without, used to skip its search.

A wrong needle loses a match, so the cases that must give none (a literal that
is optional, repeated, inside a nested alternation, or case-blind) matter more
than the ones that give some. Every default-pack pattern is checked against
the lines its own rule tests match, as the engine uses it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainsentry.rules.loader import load_rules
from trainsentry.rules.model import Pattern
from trainsentry.rules.needles import needles

PACK_TESTS = Path(__file__).resolve().parents[3] / "rules" / "tests" / "text_logs_test.yaml"


@pytest.mark.parametrize(
    ("regex", "expected"),
    [
        (r"CUDA out of memory\. Tried (?P<n>[\d.]+)", ("CUDA out of memory. Tried ",)),
        (r"Received SIGTERM|SignalException: \d+", ("Received SIGTERM", "SignalException: ")),
        (r"(?P<s>Segmentation fault|Bus error)", ("Segmentation fault", "Bus error")),
        (r"^(?:.*: )?Killed\b", ("Killed",)),
        (r"abc(?:def)ghij", ("abcdefghij",)),  # the parser inlines a group of literals
        (r"(?P<s>SIGSEGV|SIGBUS)", None),  # factored to S(?:IGSEGV|IGBUS): searched always
    ],
)  # fmt: skip
def test_required_literals_one_per_alternative(
    regex: str, expected: tuple[str, ...] | None
) -> None:
    assert needles(regex) == expected


@pytest.mark.parametrize(
    "regex",
    [
        r".",  # nothing literal
        r"(?i)cuda error",  # case-blind: "CUDA ERROR" matches too
        r"error (?i:cuda)",  # case-blind in part
        r"ab|CUDA error",  # an alternative with too short a literal
        r"(?:CUDA error)?x",  # the literal is optional
        r"(?:CUDA error)+",  # inside a repeat
        r"x(?:CUDA error|NCCL error)y",  # a nested alternation: neither is required
        r"[",  # not a regex at all
    ],
)
def test_no_needles_where_none_is_certainly_required(regex: str) -> None:
    assert needles(regex) is None


def test_every_pack_pattern_finds_its_needles_in_the_lines_it_matches() -> None:
    cases = yaml.safe_load(PACK_TESTS.read_text("utf-8"))["tests"]
    texts = [entry["text"] for case in cases for entry in case.get("logs", [])]
    checked = 0
    for rule in load_rules().rules:
        if not isinstance(rule.condition, Pattern):
            continue
        found = needles(rule.condition.regex)
        compiled = re.compile(rule.condition.regex, re.MULTILINE)
        for text in texts:
            if found is not None and compiled.search(text):
                assert any(n in text for n in found), (rule.name, text)
                checked += 1
    assert checked >= 15  # most of the pack's patterns have needles and matching cases
