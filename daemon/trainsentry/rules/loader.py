"""Rule files → `RuleSet`, with every error located at file:line:col.

PyYAML's `compose` keeps a start mark on every node; we build the Python data
ourselves from the node tree and remember where each key and value sat, so a
pydantic error path (`rules → 3 → growth → window`) maps back to the exact
spot in the file. All errors of all files are collected before raising: a
user fixing a rule file should see the whole list at once, as a compiler does.

Scalars are read with YAML 1.2 core rules, not PyYAML's 1.1 ones: `1e3` is a
number (1.1 reads it as a string) and `on`/`yes`/`no` are strings (1.1 reads
them as booleans, which silently turns a metric called `on` into `true`).
Where a boolean is expected pydantic still accepts yes/no/on/off.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trainsentry.rules.model import Rule, RuleSet
from trainsentry.rules.schema import RuleFileSpec

DEFAULT_PACK = "default"  # `--rules default` names the shipped pack
YamlPath = tuple[str | int, ...]

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"^[-+]?[0-9]+$|^0o[0-7]+$|^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_SPECIAL = {
    ".inf": float("inf"),
    "+.inf": float("inf"),
    "-.inf": float("-inf"),
    ".nan": float("nan"),
}
_MERGE = "tag:yaml.org,2002:merge"


class RuleFileError(Exception):
    """Raised with every problem found, each "file:line:col: message"."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass
class MarkedDocument:
    name: str
    errors: list[tuple[int, int, str]] = field(default_factory=list)
    values: dict[YamlPath, yaml.Mark] = field(default_factory=dict)
    keys: dict[YamlPath, yaml.Mark] = field(default_factory=dict)

    def error(self, mark: yaml.Mark | None, message: str) -> None:
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        self.errors.append((line, col, message))

    def rendered(self) -> list[str]:
        return [f"{self.name}:{ln}:{col}: {msg}" for ln, col, msg in sorted(self.errors)]


def _scalar(node: yaml.ScalarNode) -> Any:
    text = node.value
    if node.style is not None:  # quoted or block scalar: always a string
        return text
    if _NULL.match(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT.match(text):
        return int(text, 0) if text[:2] in ("0o", "0x") else int(text)
    if _FLOAT.match(text):
        return float(text)
    special = _SPECIAL.get(text.lower())
    return text if special is None else special


def build_marked(node: yaml.Node, path: YamlPath, doc: MarkedDocument) -> Any:
    doc.values.setdefault(path, node.start_mark)
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return [build_marked(item, (*path, i), doc) for i, item in enumerate(node.value)]
    if not isinstance(node, yaml.MappingNode):
        doc.error(node.start_mark, "unsupported YAML node")
        return None
    out: dict[str, Any] = {}
    inherited: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:  # `<<: *template`: explicit keys win, wherever they are
            merged = build_marked(value_node, path, doc)
            for extra in merged if isinstance(merged, list) else [merged]:
                if isinstance(extra, dict):
                    for k, v in extra.items():
                        inherited.setdefault(k, v)
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            doc.error(key_node.start_mark, "a key must be a plain name, not a list or mapping")
            continue
        key = key_node.value
        if key in out:
            doc.error(key_node.start_mark, f"duplicate key `{key}` (YAML keeps only the last)")
        doc.keys[(*path, key)] = key_node.start_mark
        doc.values.pop((*path, key), None)
        out[key] = build_marked(value_node, (*path, key), doc)
    for key, value in inherited.items():
        out.setdefault(key, value)
    return out


def unwrap(tp: Any) -> Any:
    """The model, list or dict inside Optional/Annotated/Union wrappers."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            structured = [a for a in args if typing.get_origin(a) in (list, dict) or is_model(a)]
            tp = (structured or args)[0]
        else:
            return tp


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def allowed_keys(root: type[BaseModel], loc: YamlPath) -> list[str]:
    """Field names (as written in YAML) of the model at `loc` under `root`, for did-you-mean."""
    current: Any = root
    for part in loc:
        current = unwrap(current)
        if is_model(current):
            by_alias = {(f.alias or n): f for n, f in current.model_fields.items()}
            if not isinstance(part, str) or part not in by_alias:
                return []
            current = by_alias[part].annotation
        elif typing.get_origin(current) in (list, dict):
            current = typing.get_args(current)[-1]  # the item, or the value of a mapping
        else:
            return []
    current = unwrap(current)
    return [f.alias or n for n, f in current.model_fields.items()] if is_model(current) else []


def wording(err: Any) -> str:
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    msg = msg.replace("a valid number, unable to parse string as a number", "a number")
    if msg.startswith("Input should be"):
        msg = "expected" + msg[len("Input should be") :]
        value = err.get("input")
        if isinstance(value, (str, int, float, bool)) or value is None:
            msg += f", got {value!r}"
    return msg


def report(exc: ValidationError, doc: MarkedDocument, root: type[BaseModel]) -> None:
    """Every pydantic error of a document validated as `root`, at its file:line:col."""
    seen: set[tuple[YamlPath, bool]] = set()
    for err in exc.errors():
        loc: YamlPath = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            allowed = allowed_keys(root, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = (
                f"did you mean `{close[0]}`?" if close else f"expected one of: {', '.join(allowed)}"
            )
            doc.error(doc.keys.get(loc), f"unknown key `{key}`; {hint}")
            continue
        if err["type"] == "missing":
            where = loc[:-1]
            doc.error(doc.values.get(where), f"missing required key `{loc[-1]}`")
            continue
        known = loc
        while known and known not in doc.values and known not in doc.keys:
            known = known[:-1]
        truncated = known != loc  # a union branch name such as 'list[str]' was appended
        if (known, truncated) in seen and truncated:
            continue
        seen.add((known, truncated))
        mark = doc.values.get(known) or doc.keys.get(known)
        doc.error(mark, wording(err))


def _parse(text: str, name: str) -> tuple[RuleFileSpec | None, MarkedDocument]:
    doc = MarkedDocument(name)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or "invalid YAML"
        doc.error(exc.problem_mark or exc.context_mark, f"YAML syntax: {problem}")
        return None, doc
    except yaml.YAMLError as exc:
        doc.error(None, f"YAML: {exc}")
        return None, doc
    nodes = [n for n in nodes if n is not None]
    if len(nodes) > 1:
        doc.error(nodes[1].start_mark, "one YAML document per rule file")
    data = build_marked(nodes[0], (), doc) if nodes else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        doc.error(
            nodes[0].start_mark, "expected a mapping with `rules:` (and optionally `aliases:`)"
        )
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


def parse_text(text: str, name: str = "<rules>") -> ParsedFile:
    """One file's rules and aliases; raises RuleFileError with all its errors."""
    spec, doc = _parse(text, name)
    parsed = ParsedFile([], [], dict(spec.aliases) if spec else {})
    for i, rule in enumerate(spec.rules if spec else ()):
        mark = doc.values.get(("rules", i, "name"))
        if rule.enabled:
            parsed.rules.append(rule.to_rule(f"{name}:{mark.line + 1}" if mark else name))
        else:
            parsed.disabled.append(rule.name)
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
            out.extend(
                str(p)
                for p in sorted(path.rglob("*"))
                if p.suffix in (".yaml", ".yml") and not is_rule_test_file(p.relative_to(path))
            )
        else:
            out.append(raw)
    return out


def load_rules(rule_paths: list[str] | None = None) -> RuleSet:
    """The default pack when given nothing; otherwise the files in order.

    A rule named like one in an earlier file replaces it (so a user file after
    `default` can retune or, with `enabled: false`, drop a shipped rule).
    Raises RuleFileError listing every error in every file.
    """
    paths = expand_paths(rule_paths or [DEFAULT_PACK])
    errors: list[str] = []
    rules: dict[str, Rule] = {}
    alias_files: list[dict[str, list[str]]] = []
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
        for gone in parsed.disabled:
            rules.pop(gone, None)
        for rule in parsed.rules:
            rules.pop(rule.name, None)
            rules[rule.name] = rule
        alias_files.append(parsed.aliases)
    if errors:
        raise RuleFileError(errors)
    aliases = tuple((c, tuple(t)) for f in reversed(alias_files) for c, t in f.items())
    return RuleSet(tuple(rules.values()), aliases)
