"""Which JSON `null`s are a NaN the writer could not spell, and which are a missing value.

orjson, pandas' `to_json` and JavaScript's `JSON.stringify` write a NaN (or
an infinity) as `null`: the diverged loss arrives as `"loss": null`. pandas
writes a missing cell of a sparse frame as `null` too: HF's `log_history`
as a DataFrame has `"loss": null` on every eval row and `"eval_loss": null`
on every training row. Paging on those would page every such export, so
a null counts as NaN only where the line is one of a kind the file has
written with a number in that place:

- `numbers(tags)` is told the tags of every line's numbers;
- a line's nulls are judged by the pattern (its tags with numbers, its keys
  with null): a null key counts as NaN when an earlier line held a number
  under that key together with numbers under all of this line's; the
  verdict of a pattern is taken the first time it is seen and kept, so a
  pattern first seen as missing (a training row, before any eval row gave
  `eval_loss` a number) stays missing once `eval_loss` has numbers.

So a key null from the file's first line stays ignored, a sparse frame's
empty cells are no points, and a dense series that turns null is read as
NaN, which the non-finite rules page on and every other rule skips, as it
skips a written `NaN`. Both memories are bounded (LIMIT); the snapshot keeps
the first SAVED of each, so a restart judges as before.
"""

from __future__ import annotations

from typing import Any

LIMIT = (
    64  # kinds of line a file writes: HF's rows are 3 or 4; a line of new keys each time stops here
)
SAVED = 16  # of those, kept across a restart
_SAVED_KEYS = 256  # a kind of line with more keys is not saved (the snapshot is written every 2 s)

_Pattern = tuple[frozenset[str], frozenset[str]]


class WrittenNulls:
    __slots__ = ("_kinds", "_last", "_verdicts")

    def __init__(self) -> None:
        self._kinds: set[frozenset[str]] = set()  # tags that held numbers on one line
        self._verdicts: dict[_Pattern, tuple[str, ...]] = {}
        self._last: tuple[str, ...] | None = None

    def numbers(self, tags: tuple[str, ...]) -> None:
        """The tags of a line's numbers; a line like the last (the same tuple: Shapes) is free."""
        if tags is self._last:
            return
        self._last = tags
        if len(self._kinds) < LIMIT:
            self._kinds.add(frozenset(tags))

    def as_nan(self, tags: tuple[str, ...], nulls: tuple[str, ...]) -> tuple[str, ...]:
        """Of a line's null keys, those that are a NaN (see the module's docstring)."""
        pattern = (frozenset(tags), frozenset(nulls))
        verdict = self._verdicts.get(pattern)
        if verdict is None:
            have = pattern[0]
            verdict = tuple(
                key for key in nulls if any(key in kind and have <= kind for kind in self._kinds)
            )
            if len(self._verdicts) < LIMIT:
                self._verdicts[pattern] = verdict
        return verdict

    def snapshot(self) -> dict[str, Any]:
        kinds = [sorted(k) for k in self._kinds if len(k) <= _SAVED_KEYS][:SAVED]
        verdicts = [
            [sorted(have), sorted(nulls), sorted(verdict)]
            for (have, nulls), verdict in self._verdicts.items()
            if len(have) + len(nulls) <= _SAVED_KEYS
        ][:SAVED]
        return {"kinds": kinds, "verdicts": verdicts} if kinds or verdicts else {}

    def restore(self, state: Any) -> None:
        self._kinds, self._verdicts, self._last = set(), {}, None
        if not isinstance(state, dict):
            return
        for kind in _lists(state.get("kinds"))[:SAVED]:
            self._kinds.add(frozenset(_names(kind)))
        for entry in _lists(state.get("verdicts"))[:SAVED]:
            if len(entry) == 3:
                have, nulls, verdict = (_names(part) for part in entry)
                self._verdicts[(frozenset(have), frozenset(nulls))] = tuple(verdict)


def _lists(value: Any) -> list[Any]:
    return [x for x in value if isinstance(x, list)] if isinstance(value, list) else []


def _names(value: Any) -> list[str]:
    return [str(x) for x in value] if isinstance(value, list) else []
