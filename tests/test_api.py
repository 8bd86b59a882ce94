"""The public API is what docs/api.md lists: ``outbox_core.__all__`` holds exactly its names,
the top level holds nothing else, and every import that a doc or README shows resolves from
the top level (or from ``outbox_core.testing``, the harness's own public module)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import outbox_core

REPO = Path(__file__).resolve().parents[1]
API_PAGE = REPO / "docs" / "api.md"
PUBLIC_MODULES = {
    "outbox_core",
    "outbox_core.http_headers",
    "outbox_core.http_results",
    "outbox_core.http_settings",
    "outbox_core.integrations",
    "outbox_core.integrations.django",
    "outbox_core.integrations.sqlalchemy",
    "outbox_core.steps",
    "outbox_core.testing",
    "outbox_core.testing.conformance",
    "outbox_core.testing.faults",
    "outbox_core.testing.loopback_http",
    "outbox_core.testing.pgproxy",
    "outbox_core.testing.plugin_listed",
    "outbox_core.testing.shape",
}
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
ROW = re.compile(r"^\| `(\w+)` \|", re.MULTILINE)
DOTTED = re.compile(r"`(outbox_core(?:\.\w+)+)")


def pages() -> list[Path]:
    return sorted(
        [REPO / "README.md", *REPO.glob("outbox-*/README.md"), *(REPO / "docs").rglob("*.md")]
    )


def doc_imports() -> list[tuple[str, str, str]]:
    """(page, module, name) for every ``from outbox_core... import name`` in a python block."""
    found = []
    for page in pages():
        for block in BLOCK.findall(page.read_text("utf-8")):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "outbox_core"
                ):
                    module = node.module or ""
                    found += [(page.name, module, alias.name) for alias in node.names]
                elif isinstance(node, ast.Import):
                    found += [
                        (page.name, alias.name, "")
                        for alias in node.names
                        if alias.name.startswith("outbox_core")
                    ]
    return found


def test_every_import_the_docs_show_resolves_from_the_public_modules() -> None:
    imports = doc_imports()
    assert any(module == "outbox_core" for _, module, _ in imports)  # the parse finds them
    wrong = [
        f"{page}: from {module} import {name or '...'}"
        for page, module, name in imports
        if module not in PUBLIC_MODULES
    ]
    assert wrong == [], "import these from outbox_core (and list them in docs/api.md)"
    for _page, module, name in imports:
        if name:
            public = importlib.import_module(module).__all__
            assert name in public, f"{name} is not in {module}.__all__"


def test_every_name_the_docs_spell_out_is_public() -> None:
    """``outbox_core.erase_subject`` in prose: the name is public where the doc says it is."""
    wrong = []
    for page in pages():
        if page == API_PAGE:  # it names internal modules to say they are internal
            continue
        for dotted in DOTTED.findall(page.read_text("utf-8")):
            module, _, name = dotted.rpartition(".")
            if dotted in PUBLIC_MODULES or dotted == "outbox_core.plugins":  # the entry point group
                continue
            if module not in PUBLIC_MODULES or name not in importlib.import_module(module).__all__:
                wrong.append(f"{page.name}: {dotted}")
    assert wrong == []


def test_all_is_exactly_what_docs_api_md_lists() -> None:
    text = API_PAGE.read_text("utf-8")
    listed = ROW.findall(text.split("## `outbox_core.testing`")[0])
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert sorted(listed) == sorted(outbox_core.__all__)


def test_the_top_level_holds_only_the_public_names() -> None:
    names = {
        name
        for name, value in vars(outbox_core).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert names == set(outbox_core.__all__)


def test_the_readme_links_the_api_page() -> None:
    assert "(docs/api.md)" in (REPO / "README.md").read_text("utf-8")
