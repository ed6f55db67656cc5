"""Globs are matched in linear time and mean what the regex they replaced meant."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from trainsentry.rules.aliases import Aliases, Glob, glob_matcher

patterns = st.text(alphabet="ab/*", max_size=8)
texts = st.text(alphabet="ab/", max_size=12)


def regex_star(pattern: str, text: str) -> str | None:
    """The backtracking regex globs used to compile to, and its first group."""
    compiled = re.compile("^" + "(.*)".join(re.escape(p) for p in pattern.split("*")) + "$")
    match = compiled.match(text)
    if match is None:
        return None
    return match.group(1) if "*" in pattern else ""


@given(patterns, texts)
def test_a_glob_matches_and_captures_as_the_greedy_regex_did(pattern: str, text: str) -> None:
    assert Glob(pattern).star(text) == regex_star(pattern, text)


def test_a_many_star_glob_settles_a_long_tag_at_once() -> None:
    """`*a*a*a*a*b` against 100,000 a's: the regex backtracked for tens of seconds."""
    tag = "a" * 100_000
    assert not Glob("*a*a*a*a*b").match(tag)
    assert Glob("*a*a*a*a*").match(tag)
    matcher = glob_matcher(["*grad*norm*x", "*a*a*a*a*b"])
    assert matcher is not None and not matcher.match(tag + "c")


def test_an_alias_glob_puts_the_first_star_into_its_canonical_name() -> None:
    aliases = Aliases({"act_mean/*": ("probe/act_mean/*",)})
    assert aliases.resolve("probe/act_mean/encoder.layer.0") == "act_mean/encoder.layer.0"
