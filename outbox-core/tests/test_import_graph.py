"""The modules of outbox_core import one way: a lower module never imports an upper one, so
the import graph has no circle. Imports inside functions count (they only defer the circle), and
so do imports under ``if TYPE_CHECKING:`` (the two modules still need each other). The check is
``outbox_core.testing.shape``, which every package's suite runs on its own source."""

from __future__ import annotations

from pathlib import Path

import outbox_core
from outbox_core.testing.shape import circles, import_circles, import_graph


def test_the_import_graph_of_outbox_core_has_no_circle() -> None:
    assert import_graph(Path(outbox_core.__file__).parent)["outbox_core.cli"], "the parse finds"
    assert import_circles(outbox_core) == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]


def test_an_import_for_type_checking_only_closes_a_circle_too(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attempt.py").write_text("from .tracing import fence_event\n")
    (package / "tracing.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .attempt import ClaimedAction\n"
    )
    assert circles(import_graph(package)) == [["pkg.attempt", "pkg.tracing", "pkg.attempt"]]


def test_a_relative_import_of_a_submodule_is_an_edge_to_that_submodule(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .sub import leaf\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "leaf.py").write_text("from .. import other\n")
    (package / "other.py").write_text("import pkg.sub.leaf\n")
    assert import_graph(package) == {
        "pkg": {"pkg.sub.leaf"},
        "pkg.other": {"pkg.sub.leaf"},
        "pkg.sub": set(),
        "pkg.sub.leaf": {"pkg.other"},
    }
