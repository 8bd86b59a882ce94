"""The shape of a package's source, checked the same way in every outbox package's tests (issue
33): its import graph has no circle, and a module over 450 lines says in its first lines why it
is one piece. A package's suite runs them as a pytest class on its own import::

    import outbox_email
    from outbox_core.testing.shape import PackageShape

    class TestShape(PackageShape):
        package = outbox_email

Imports inside functions count (they only defer a circle), and so do imports under
``if TYPE_CHECKING:``: they never run, but a circle through them is still two modules that each
need the other (``attempt`` and ``tracing`` were one, through ``ClaimedAction``), and the fix is
the same, moving what both need below both.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType
from typing import ClassVar

__all__ = [
    "LIMIT",
    "REASON",
    "PackageShape",
    "circles",
    "import_circles",
    "import_graph",
    "unexplained_long_modules",
]

LIMIT = 450
"""The length over which a module says why it is one piece."""

REASON = re.compile(r"\b(longer than|over) \d[\d,]* lines\b", re.IGNORECASE)
"""How a module says it: "Longer than 450 lines on purpose: ...", "(one module, a little over
500 lines, so that ...)"."""

REASON_LINES = 12
"""The first lines, where the reason is looked for."""


def _root(package: ModuleType) -> Path:
    if package.__file__ is None:
        raise ValueError(f"{package.__name__}: a namespace package has no source folder")
    return Path(package.__file__).resolve().parent


def package_modules(root: Path) -> dict[str, Path]:
    """Every module under the package folder ``root``, by dotted name (``root``'s name first)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported(modules: dict[str, Path], name: str) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports, anywhere in its body."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
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
                found.add(submodule if submodule in modules else module)
    return {module for module in found if module in modules and module != name}


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


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package folder ``root`` and the package's modules it imports."""
    modules = package_modules(root)
    return {name: imported(modules, name) for name in modules}


def import_circles(package: ModuleType) -> list[str]:
    """The import circles among ``package``'s modules, each as ``a -> b -> a``; none is right."""
    return [" -> ".join(circle) for circle in circles(import_graph(_root(package)))]


def unexplained_long_modules(package: ModuleType, limit: int = LIMIT) -> list[str]:
    """``package``'s modules over ``limit`` lines whose first lines do not say why they are one
    piece, each as ``path (N lines)`` relative to the package; none is right."""
    root = _root(package)
    unexplained = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text("utf-8").splitlines()
        if len(lines) > limit and not REASON.search("\n".join(lines[:REASON_LINES])):
            unexplained.append(f"{path.relative_to(root)} ({len(lines)} lines)")
    return unexplained


class PackageShape:
    """The shape checks as a pytest class: a package's suite subclasses it and sets ``package``.
    ``awaiting`` names a check that is known to fail until another change lands (``"circles"``,
    ``"sizes"``) with the reason: the test is then an expected failure, and fails as soon as the
    check passes, so that the entry is removed."""

    package: ClassVar[ModuleType]
    awaiting: ClassVar[dict[str, str]] = {}

    def _expect_none(self, check: str, found: list[str]) -> None:
        import pytest

        reason = self.awaiting.get(check)
        if reason is None:
            assert found == []
        elif found:
            pytest.xfail(f"{reason}: {found}")
        else:
            pytest.fail(f"{check} of {self.package.__name__} passes now: remove it from awaiting")

    def test_the_import_graph_has_no_circle(self) -> None:
        self._expect_none("circles", import_circles(self.package))

    def test_every_module_over_450_lines_says_why_it_is_one_piece_in_its_first_lines(
        self,
    ) -> None:
        self._expect_none("sizes", unexplained_long_modules(self.package))
