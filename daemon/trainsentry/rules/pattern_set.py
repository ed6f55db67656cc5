"""The regexes of pattern rules, compiled for RE2 and matched together in one pass.

A pattern rule's regex runs on every line a job prints, and the job prints
what it likes. Python's `re` backtracks: `(a+)+$` on a line of thirty `a`s
and a `!` takes it minutes, holding the interpreter lock, and with it the
whole daemon (the HTTP API, every other run's alerts). RE2 compiles a regex
to an automaton and runs it in time linear in the text, whatever the
pattern; what cannot be run that way (a backreference, lookaround, a
possessive quantifier or atomic group) is refused when the rule file is read
(`compile_regex`, the reason said at file:line:col by the schema), never met
on a live line.

A text log is mostly progress lines that no rule can match. RE2's `Set`
runs every pattern of a pack over an event's text in one scan and says which
matched (`PatternSet.matching`); only for those does Python do more, and the
rule's own regex runs (`search`) for its named groups and where it matched.

A line longer than MAX_LINE_CHARS is cut when read (sources/text_events.py),
and the event keeps the character that followed each cut (`TextEvent.cuts`).
A match is taken only where it lies within a piece of the text the daemon
holds, with the real characters on both sides of it as RE2's context: so a
`$`, `\\b` or a run across the cut never matches what the whole line does not
(`(a+)+$` on a long line of `a`s and a `!` past the cut); what lay beyond the
cut is not seen, and a match that needed it is not made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import re2

from trainsentry.point import TextEvent

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is said once, by the caller, at its line
# `^` and `$` at each line of an event (a traceback is many), as the pack was written for
_MULTILINE = "(?m)"

Regex = Any  # re2's compiled regex: the package has no type stubs

# RE2's words for what it cannot run in linear time, and why it is refused
_REFUSALS = (
    (
        re.compile(r"invalid escape sequence: \\[1-9]"),
        "a backreference ({found}) cannot be matched in linear time; match the text itself",
    ),
    (
        re.compile(r"invalid escape sequence: \\Z"),
        "\\Z is spelt \\z (the end of the text) in RE2",
    ),
    (
        re.compile(r"invalid perl operator: \(\?<?[=!]"),
        "lookaround ({found}) cannot be matched in linear time; match the words around"
        " it instead, or write a second rule",
    ),
    (
        re.compile(r"invalid perl operator: \(\?>"),
        "an atomic group ((?>...)) is not needed: RE2 never backtracks; write (?:...)",
    ),
    (
        re.compile(r"bad repetition operator: [*+?}]\+"),
        "a possessive quantifier ({found}) is not needed: RE2 never backtracks; drop the last +",
    ),
    (
        re.compile(r"invalid repetition size"),
        "a repeat too large for RE2 ({found}): a count over 1000, or nested counts"
        " that multiply past it",
    ),
    (
        re.compile(r"pattern too large"),
        "the pattern compiles to more than RE2's memory bound for one regex; make it smaller",
    ),
)


class PatternError(ValueError):
    """A regex RE2 cannot run; the message is the reason, for a person."""


def compile_regex(regex: str) -> Regex:
    """`regex` compiled for RE2 (`^`/`$` at each line); PatternError with the reason if it
    cannot be."""
    try:
        return re2.compile(_MULTILINE + regex, _OPTIONS)
    except re2.error as exc:
        raise PatternError(_reason(exc, regex)) from None


def _reason(exc: Exception, regex: str) -> str:
    said = exc.args[0] if exc.args else str(exc)
    if isinstance(said, bytes):
        said = said.decode("utf-8", "replace")
    said = str(said)
    named = re.search(r"\(\?P=\w*\)?", regex)
    if named is not None and "(?P" in said:  # RE2 names only the operator's first letters
        return _REFUSALS[0][1].format(found=named.group(0))
    for shape, why in _REFUSALS:
        found = shape.search(said)
        if found is not None:
            return why.format(found=said.partition(": ")[2] or found.group(0))
    return f"not RE2 syntax: {said}"


class PatternSet:
    """Some rules' regexes compiled together as one RE2 Set: which of them match a text."""

    __slots__ = ("_set", "regexes")

    def __init__(self, regexes: Sequence[str]) -> None:
        self.regexes = tuple(regexes)
        self._set: Any = None
        if regexes:
            together = re2.Set.SearchSet(_OPTIONS)
            for regex in regexes:
                together.Add(_MULTILINE + regex)
            together.Compile()
            self._set = together

    def __reduce__(self) -> tuple[type[PatternSet], tuple[tuple[str, ...]]]:
        """Pickled as its regexes (the log engine is part of the alert-state snapshot): an
        RE2 Set is compiled again, not copied."""
        return PatternSet, (self.regexes,)

    def matching(self, text: str) -> list[int]:
        """The indices of the regexes that match somewhere in `text`, in order; one scan.

        An RE2 Set has no fallback when its automaton outgrows its memory: it starts the
        automaton over and goes on (RE2's dfa.cc), so an empty answer is an answer."""
        if self._set is None:
            return []
        try:
            found = self._set.Match(text)
        except UnicodeEncodeError:  # a lone surrogate (a JSON record's \\ud800): not UTF-8
            found = self._set.Match(_utf8(text))
        if not found:
            return []
        if len(found) > 1:
            found.sort()
        return found


# `\A`, `\z` (an escape, not an escaped backslash before a letter) or a flag group that
# turns `(?m)` off: the regex sees where the text starts or ends, not only its lines
_TEXT_ANCHOR = re.compile(r"(?<!\\)(?:\\\\)*\\[Az]|\(\?[a-zA-Z]*-[a-zA-Z]*m[a-zA-Z]*[:)]")


def text_anchored(regex: str) -> bool:
    """Whether `regex` may match a line alone and not the same line among others (a
    match at the text's start or end): such a rule judges plain lines one by one."""
    return _TEXT_ANCHOR.search(regex) is not None


def match_text(event: TextEvent) -> str:
    """The text the patterns run on: the event's lines, each cut one followed by the
    character that followed its cut (the context `search` keeps out of any match)."""
    lines = event.lines
    if not event.cuts:
        return lines[0] if len(lines) == 1 else "\n".join(lines)
    after = dict(event.cuts)
    return "\n".join(line + after.get(i, "") for i, line in enumerate(lines))


def search(regex: Regex, event: TextEvent, text: str) -> Any:
    """The first match of `regex` in `text` (`match_text(event)`), or None. In an event
    with cut lines, only a match within one piece between cuts (module docstring)."""
    try:
        return _search(regex, event, text)
    except UnicodeEncodeError:  # as in `matching`: the same length, each surrogate a ?
        return _search(regex, event, _utf8(text))


def _search(regex: Regex, event: TextEvent, text: str) -> Any:
    if not event.cuts:
        return regex.search(text)
    for start, end in _pieces(event):
        found = regex.search(text, start, end)
        if found is not None:
            return found
    return None


def line_of(found: Any) -> int:
    """The index, among the event's lines, of the line a match starts in."""
    return int(found.string.count("\n", 0, found.start()))


def _pieces(event: TextEvent) -> list[tuple[int, int]]:
    """(start, end) in `match_text(event)` of each stretch the whole lines also hold as is:
    a piece ends where a line was cut (the character after, kept, is context) and the
    next starts at the line after it (the newline before, the real one, is context)."""
    after = dict(event.cuts)
    pieces: list[tuple[int, int]] = []
    start = offset = 0
    for i, line in enumerate(event.lines):
        end = offset + len(line)
        if i in after:
            pieces.append((start, end))
            offset = end + len(after[i]) + 1
            start = offset
        else:
            offset = end + 1
    if start < offset:
        pieces.append((start, offset - 1))
    return pieces


def _utf8(text: str) -> str:
    """`text` with each character UTF-8 cannot encode (a lone surrogate) as `?`."""
    return text.encode("utf-8", "replace").decode("utf-8")
