"""The shape of src/draftsman: no import circles, no oversized modules, no internal issue
numbers in what users read.

Imports are read with `ast`, not by importing, so a circle that only closes inside a function
body (an import run at call time) counts too; imports under `if TYPE_CHECKING:` do not, since
they never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "draftsman"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(tree: ast.AST, package: str) -> list[str]:
    """Dotted names of every import that can run, at module level or inside functions.
    `from a.b import c` yields a.b and a.b.c (c may be a submodule); relative imports are
    resolved against `package`."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the draftsman modules it imports (only names that are modules)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = {n for n in imported_names(tree, package) if n in mods and n != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Iterative depth-first search with colours."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
                continue
            if nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_find_cycle_reports_the_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_type_checking_and_function_imports():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from draftsman.engine import Engine\n"
        "def f():\n    from draftsman.theory import pipelined\n"
        "from . import sibling\n")
    names = imported_names(tree, "draftsman.strategies")
    assert "draftsman.engine" not in names
    assert "draftsman.theory.pipelined" in names
    assert "draftsman.strategies.sibling" in names


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and graph["draftsman.engine"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_module_over_500_lines():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines())
             for name, path in modules().items()}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_no_issue_numbers_in_source():
    pattern = re.compile(r"\bissue \d+", re.IGNORECASE)
    hits = [f"{path.relative_to(SRC)}:{i}: {line.strip()}"
            for path in modules().values()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, "internal issue numbers in src:\n" + "\n".join(hits)
