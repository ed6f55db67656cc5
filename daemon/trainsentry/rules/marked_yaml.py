"""YAML read with the file:line:col of every key and value, and pydantic's errors put back there.

PyYAML's `compose` keeps a start mark on every node; the Python data is built
here from the node tree, remembering where each key and value sat, so a
pydantic error path (`rules → 3 → growth → window`) maps back to the exact
spot in the file. Rule files, rule test files and the config file are all
read through this one reader, so they share one idea of YAML and one wording
of errors: all errors of a file at once, "did you mean" for a misspelt key.

Scalars are read with YAML 1.2 core rules, not PyYAML's 1.1 ones: `1e3` is a
number (1.1 reads it as a string) and `on`/`yes`/`no` are strings (1.1 reads
them as booleans, which silently turns a metric called `on` into `true`).
Where a boolean is expected pydantic still accepts yes/no/on/off.

Reading is bounded: a file is at most MAX_FILE_BYTES, and its data at most
MAX_VALUES keys, items and scalars once aliases are expanded. A YAML alias
bomb (a few hundred bytes of anchors, each naming the one before many times)
expands to billions of values; it costs nothing to compose, since the parser
shares aliased nodes, but building the data from the tree would take the
daemon's memory and, on a SIGHUP, its loop. It is refused at file:line:col.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

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


MAX_FILE_BYTES = 1 << 20  # the default pack is 20 kB
MAX_VALUES = 100_000  # the default pack has under 300


class _TooLarge(Exception):
    """The document expands to more than MAX_VALUES values."""

    def __init__(self, mark: yaml.Mark) -> None:
        self.mark = mark


@dataclass
class MarkedDocument:
    name: str
    errors: list[tuple[int, int, str]] = field(default_factory=list)
    values: dict[YamlPath, yaml.Mark] = field(default_factory=dict)
    keys: dict[YamlPath, yaml.Mark] = field(default_factory=dict)
    budget: int = MAX_VALUES  # values still allowed to be built

    def error(self, mark: yaml.Mark | None, message: str) -> None:
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        self.errors.append((line, col, message))

    def rendered(self) -> list[str]:
        return [f"{self.name}:{ln}:{col}: {msg}" for ln, col, msg in sorted(self.errors)]

    def known(self, loc: YamlPath) -> YamlPath:
        """`loc`, cut back to a key or value the file has (pydantic appends union branch
        names such as 'list[str]' to a path)."""
        while loc and loc not in self.values and loc not in self.keys:
            loc = loc[:-1]
        return loc


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
    doc.budget -= 1
    if doc.budget < 0:
        raise _TooLarge(node.start_mark)
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


def read_mapping(text: str, doc: MarkedDocument, what: str, expected: str) -> dict[str, Any] | None:
    """The one YAML document of `text` as marked data, if it is a mapping; else None
    with the error in `doc`. `what` names the file ("rule file"), `expected` says
    what its top level should be."""
    if len(text) > MAX_FILE_BYTES:
        doc.error(None, f"larger than {MAX_FILE_BYTES >> 20} MB: not a {what} (refused unread)")
        return None
    try:
        nodes = [n for n in yaml.compose_all(text, Loader=yaml.SafeLoader) if n is not None]
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or "invalid YAML"
        doc.error(exc.problem_mark or exc.context_mark, f"YAML syntax: {problem}")
        return None
    except yaml.YAMLError as exc:
        doc.error(None, f"YAML: {exc}")
        return None
    if len(nodes) > 1:
        doc.error(nodes[1].start_mark, f"one YAML document per {what}")
    try:
        data = build_marked(nodes[0], (), doc) if nodes else None
    except _TooLarge as exc:  # aliases expanding without end: refused, not built
        doc.error(exc.mark, f"expands to more than {MAX_VALUES:,} values (YAML aliases?): refused")
        return None
    except RecursionError:
        doc.error(nodes[0].start_mark, "nested too deeply to be a " + what)
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        doc.error(nodes[0].start_mark, f"expected {expected}")
        return None
    return data


@dataclass(frozen=True, slots=True)
class Problem:
    """One pydantic error, said in the file's terms."""

    kind: Literal["unknown", "missing", "invalid"]
    loc: YamlPath  # the unknown key, the mapping missing a key, or the value at fault
    key: str  # the unknown or missing key
    text: str  # the hint (unknown), or the wording of what is wrong (invalid)


def problems(exc: ValidationError, root: type[BaseModel]) -> Iterator[Problem]:
    """Every error of a document validated as `root`; a caller places and words them."""
    for err in exc.errors():
        loc: YamlPath = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            allowed = allowed_keys(root, loc[:-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = (
                f"did you mean `{close[0]}`?" if close else f"expected one of: {', '.join(allowed)}"
            )
            yield Problem("unknown", loc, key, hint)
        elif err["type"] == "missing":
            yield Problem("missing", loc[:-1], str(loc[-1]), "")
        else:
            yield Problem("invalid", loc, "", wording(err))


def report(exc: ValidationError, doc: MarkedDocument, root: type[BaseModel]) -> None:
    """Every pydantic error of a document validated as `root`, at its file:line:col."""
    seen: set[YamlPath] = set()
    for p in problems(exc, root):
        if p.kind == "unknown":
            doc.error(doc.keys.get(p.loc), f"unknown key `{p.key}`; {p.text}")
            continue
        if p.kind == "missing":
            doc.error(doc.values.get(p.loc), f"missing required key `{p.key}`")
            continue
        known = doc.known(p.loc)
        if known != p.loc:  # a union branch name such as 'list[str]' was appended
            if known in seen:
                continue
            seen.add(known)
        doc.error(doc.values.get(known) or doc.keys.get(known), p.text)
