"""The house's rooms: no import cycle in the daemon, no import against the data path.

The data moves one way (sources → store → rules → alerts → sinks, with the
runtime wiring them and the commands on top), so a module may import only
rooms at its own level or below. Read from the source, every import counted:
at module level, inside functions, and under TYPE_CHECKING alike, since each
is a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.paths import REPO

PACKAGE = REPO / "daemon" / "trainsentry"

# Lowest first. A module may import from its own room and from rooms of a lower level.
LEVELS: list[set[str]] = [
    {"__init__", "alert", "point", "stop_signals", "jobs"},  # the shared types
    {"sources", "store", "state", "watching"},  # reading, and what it keeps
    {"rules"},  # judging
    {"sinks", "actions"},  # the services alerts go to
    {"alerts"},  # the notification stage, in front of the sinks
    {"terminal", "http_api"},  # what people and scrapers see
    {"backtest", "ruletest", "config"},  # commands' engines and the boundary
    {"runtime"},  # the live daemon, wiring everything
    {"cli", "arguments", "__main__"},  # the command line
]
LEVEL = {room: i for i, rooms in enumerate(LEVELS) for room in rooms}
ROOT_MODULES_AT_MOST = 8


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The daemon's modules `path` imports (a `from pkg import mod` names the module)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolved against this package
                package = here.split(".")[: -node.level] if path.name != "__init__.py" else None
                base = ".".join([*(package or here.split(".")), base])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != here}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_daemon_has_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_a_cycle_is_caught() -> None:
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(made_up) == [["a", "b", "c"]]


def test_every_room_has_a_level(graph: dict[str, set[str]]) -> None:
    assert {room(m) for m in graph} - set(LEVEL) == set()


def test_no_module_imports_against_the_data_path(graph: dict[str, set[str]]) -> None:
    against = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        for d in deps
        if LEVEL[room(d)] > LEVEL[room(m)]
    )
    assert against == []


def test_few_modules_stay_at_the_root() -> None:
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, root


def test_test_files_have_unique_names() -> None:
    # pytest's default import mode imports a test file by its basename: two files of
    # one name stop the whole suite at collection, wherever they lie.
    names: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
