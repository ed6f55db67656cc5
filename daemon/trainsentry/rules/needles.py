"""The literal text a regex cannot match without: a cheap test before the regex.

A job's stdout is progress lines, and every line is an event that each pattern
rule would search; Python's `re` has no multi-pattern scan, and its searches
were most of a text line's cost (bench/ingest_text.py). But nearly every
pattern names words that must be in the line (`CUDA out of memory`, `DUE TO
TIME LIMIT`), and a substring test is a fraction of a search. So each regex
is parsed once with the stdlib's own parser (`re._parser`, the one `re.compile`
uses: no other parser knows Python's syntax exactly) into needles, one per
top-level alternative, each a run of literal characters that alternative
requires. An event with none of a rule's needles cannot match it.

Only what is certainly required is taken: literals directly in the sequence
or in a plain group, never inside a repeat, an optional part or a nested
alternation. Where that leaves an alternative without a literal of
MIN_NEEDLE characters, or the pattern ignores case, there are no needles and
the rule is always searched: a missing needle only costs time, a wrong one
would lose a match.
"""

from __future__ import annotations

import re
from typing import Any

MIN_NEEDLE = 3

try:  # the parser re.compile uses, private: needles() says "search always" on any surprise
    import re._constants as _c
    import re._parser as _parser
except ImportError:  # Python 3.10: the same parser under its former names
    import sre_constants as _c  # type: ignore[no-redef, unused-ignore]
    import sre_parse as _parser  # type: ignore[no-redef, unused-ignore]


def needles(regex: str) -> tuple[str, ...] | None:
    """One required literal per top-level alternative of `regex`; None for "search always"."""
    try:
        parsed = _parser.parse(regex)
    except (re.error, RecursionError, TypeError, ValueError):
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    out: list[str] = []
    for branch in _branches(list(parsed)):
        literal = _longest_literal(branch)
        if literal is None or len(literal) < MIN_NEEDLE:
            return None
        out.append(literal)
    return tuple(out)


def _branches(items: list[Any]) -> list[list[Any]]:
    """The top-level alternatives: `a|b`, or `(?P<x>a|b)` as the whole pattern."""
    if len(items) == 1:
        op, av = items[0]
        if op is _c.BRANCH:
            return [list(b) for b in av[1]]
        if op is _c.SUBPATTERN and not (av[1] & re.IGNORECASE):
            inner = list(av[3])
            if len(inner) == 1 and inner[0][0] is _c.BRANCH:
                return [list(b) for b in inner[0][1][1]]
    return [items]


def _longest_literal(items: list[Any]) -> str | None:
    """The longest run of literal characters the sequence requires; None if it ignores
    case somewhere (its literals then match other spellings)."""
    best, run = "", ""
    for op, av in items:
        if op is _c.LITERAL:
            run += chr(av)
            continue
        best, run = max(best, run, key=len), ""
        if op is _c.SUBPATTERN:
            if av[1] & re.IGNORECASE:
                return None
            inner = list(av[3])
            if not any(o is _c.BRANCH for o, _ in inner):
                found = _longest_literal(inner)
                if found is None:
                    return None
                best = max(best, found, key=len)
    return max(best, run, key=len)
