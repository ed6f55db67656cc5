"""Rule files → `RuleSet`, with every error located at file:line:col (marked_yaml.py).

All errors of all files are collected before raising: a user fixing a rule
file should see the whole list at once, as a compiler does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainsentry.rules.marked_yaml import MarkedDocument, read_mapping, report
from trainsentry.rules.model import Rule, RuleSet
from trainsentry.rules.schema import RuleFileSpec

DEFAULT_PACK = "default"  # `--rules default` names the shipped pack


class RuleFileError(Exception):
    """Raised with every problem found, each "file:line:col: message"."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def _parse(text: str, name: str) -> tuple[RuleFileSpec | None, MarkedDocument]:
    doc = MarkedDocument(name)
    data = read_mapping(
        text, doc, "rule file", "a mapping with `rules:` (and optionally `aliases:`)"
    )
    if data is None:
        return None, doc
    if not set(data) - {"version"} or ("rules" in data and data["rules"] is None):
        # an empty or half-written file (a non-atomic rewrite caught by a SIGHUP reads
        # so) must not silently drop every rule: none has to be said
        where = doc.values.get(("rules",)) or doc.keys.get(("rules",))
        doc.error(where, "no rules in this file; write `rules: []` if none is meant")
        return None, doc
    _duplicate_names(data, doc)  # on the raw data: with every other error, not after them
    try:
        return RuleFileSpec.model_validate(data), doc
    except ValidationError as exc:
        report(exc, doc, RuleFileSpec)
        return None, doc


def _duplicate_names(data: dict[str, Any], doc: MarkedDocument) -> None:
    rules = data.get("rules")
    if not isinstance(rules, list):
        return
    names: set[str] = set()
    for i, rule in enumerate(rules):
        name = rule.get("name") if isinstance(rule, dict) else None
        if not isinstance(name, str):
            continue
        if name in names:
            doc.error(
                doc.values.get(("rules", i, "name")), f"rule `{name}` is defined twice in this file"
            )
        names.add(name)


def default_pack_text() -> str:
    return (resources.files("trainsentry") / "packs" / "default.yaml").read_text("utf-8")


@dataclass
class ParsedFile:
    rules: list[Rule]
    disabled: list[str]  # names with `enabled: false`: they remove a rule of an earlier file
    aliases: dict[str, list[str]]
    none_meant: bool = False  # `rules: []`, said in so many words
    # `enabled: false` with a whole body: off, until a later file says `{name, enabled: true}`
    dormant: list[Rule] = field(default_factory=list)
    switched_on: list[tuple[str, str]] = field(default_factory=list)  # (name, file:line:col)


def parse_text(text: str, name: str = "<rules>") -> ParsedFile:
    """One file's rules and aliases; raises RuleFileError with all its errors."""
    spec, doc = _parse(text, name)
    parsed = ParsedFile([], [], dict(spec.aliases) if spec else {})
    parsed.none_meant = spec is not None and "rules" in spec.model_fields_set and not spec.rules
    for i, rule in enumerate(spec.rules if spec else ()):
        mark = doc.values.get(("rules", i, "name"))
        origin = f"{name}:{mark.line + 1}" if mark else name
        if rule.enabled and rule.switch_only():
            where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
            parsed.switched_on.append((rule.name, where))
        elif rule.enabled:
            parsed.rules.append(rule.to_rule(origin))
        else:
            parsed.disabled.append(rule.name)
            if rule.has_condition():
                parsed.dormant.append(rule.to_rule(origin))
    if doc.errors:
        raise RuleFileError(doc.rendered())
    return parsed


def is_rule_test_file(path: Path) -> bool:
    """Rule unit tests live beside their pack (`rules/tests/*_test.yaml`) but are not rules."""
    return path.stem.endswith("_test") or "tests" in path.parts


def expand_paths(paths: list[str]) -> list[str]:
    """Directories become the rule files under them, sorted; `default` stays as is.

    Files named explicitly are always taken; inside a directory, rule test
    files are skipped so `--rules rules/` loads the pack, not its tests.
    """
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if raw != DEFAULT_PACK and path.is_dir():
            found = [
                str(p)
                for p in sorted(path.rglob("*"))
                if p.suffix in (".yaml", ".yml") and not is_rule_test_file(p.relative_to(path))
            ]
            if not found:  # a log root given after --rules reads as one: say so
                why = "no rule files (*.yaml, *.yml) here (a log directory? they go before --rules)"
                raise RuleFileError([f"{raw}:1:1: {why}"])
            out.extend(found)
        else:
            out.append(raw)
    return out


def load_rules(rule_paths: list[str] | None = None, *, alone: bool = False) -> RuleSet:
    """The default pack when given nothing; otherwise the files in order.

    A rule named like one in an earlier file replaces it (so a user file after
    `default` can retune or, with `enabled: false`, drop a shipped rule).
    Raises RuleFileError listing every error in every file, and when the files hold
    no rule at all unless one says `rules: []` (or `alone`: a file checked by itself,
    which may hold only aliases).
    """
    paths = expand_paths(rule_paths or [DEFAULT_PACK])
    errors: list[str] = []
    rules: dict[str, Rule] = {}
    dormant: dict[str, Rule] = {}
    alias_files: list[dict[str, list[str]]] = []
    none_meant = False
    for path in paths:
        try:
            text = default_pack_text() if path == DEFAULT_PACK else Path(path).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{path}:1:1: cannot read: {getattr(exc, 'strerror', None) or exc}")
            continue
        try:
            parsed = parse_text(text, path)
        except RuleFileError as exc:
            errors.extend(exc.errors)
            continue
        none_meant = (
            none_meant or parsed.none_meant or bool(parsed.disabled) or bool(parsed.switched_on)
        )
        for gone in parsed.disabled:
            rules.pop(gone, None)
            dormant.pop(gone, None)
        dormant.update((rule.name, rule) for rule in parsed.dormant)
        for rule in parsed.rules:
            rules.pop(rule.name, None)
            dormant.pop(rule.name, None)
            rules[rule.name] = rule
        for wanted, where in parsed.switched_on:
            if wanted in dormant:
                rules[wanted] = dormant.pop(wanted)
            elif wanted not in rules and not alone:  # checked by itself: its pack is not here
                errors.append(f"{where}: no rule {wanted!r} in an earlier file to switch on")
        alias_files.append(parsed.aliases)
    if not errors and not rules and not none_meant and not alone:
        errors.append(
            f"{paths[-1]}:1:1: these rule files hold no rule: nothing would be watched; "
            "write `rules: []` if that is meant"
        )
    if errors:
        raise RuleFileError(errors)
    aliases = tuple((c, tuple(t)) for f in reversed(alias_files) for c, t in f.items())
    return RuleSet(tuple(rules.values()), aliases)
