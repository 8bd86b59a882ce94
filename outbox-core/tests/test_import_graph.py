"""The modules of outbox_core import one way: a lower module never imports an upper one, so
the import graph has no circle. Imports inside functions count (they only defer the circle);
imports under ``if TYPE_CHECKING:`` do not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import outbox_core

PACKAGE = Path(outbox_core.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(name: str) -> set[str]:
    """The outbox_core modules that ``name`` imports when it runs, anywhere in its body."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for branch in child.orelse:
                    visit_one(branch)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in MODULES else module)
        visit(node)

    visit(ast.parse(path.read_text("utf-8")))
    return {module for module in found if module in MODULES and module != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as a path that starts and ends at the same module."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        for target in sorted(graph[node]):
            if target in path:
                circle = [*path[path.index(target) :], target]
                key = frozenset(circle)
                if key not in seen:
                    seen.add(key)
                    found.append(circle)
            elif target not in done:
                walk(target, [*path, target])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return found


def test_the_import_graph_of_outbox_core_has_no_circle() -> None:
    graph = {name: imported(name) for name in MODULES}
    assert graph["outbox_core.cli"], "the parse finds imports"
    assert [" -> ".join(circle) for circle in circles(graph)] == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
