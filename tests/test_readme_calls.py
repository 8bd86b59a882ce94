"""The READMEs' Python matches the real API: every call of an outbox function or method in a
```python block binds to its signature, is awaited exactly when it is a coroutine function,
and every call written in running text (`` `outbox_core.erase_subject(conn, account)` ``) is
awaited there when the function is a coroutine. A README that shows a coroutine without
``await`` teaches a call that does nothing."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "outbox-issues" / "README.md", REPO / "outbox-feedback" / "README.md"]
"""The READMEs held to the rule (issue 31, item 9)."""
PYTHON = re.compile(r"^```python[ \t]*\n(?P<body>.*?)^```", re.S | re.M)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CALL = re.compile(r"`(?P<await>await )?(?P<name>[A-Za-z_][\w.]*)\((?P<args>[^`]*)\)`")
PACKAGES = ("outbox_issues", "outbox_feedback", "outbox_core")


@dataclass(frozen=True)
class Problem:
    where: str
    what: str


def resolve(dotted: str, names: dict[str, Any]) -> Any:
    """What ``dotted`` names: through the block's own names, else a module path, else a name
    the packages export; None when it is not the packages'."""
    head, *rest = dotted.split(".")
    target: Any = names.get(head)
    if target is None:
        for package in PACKAGES:
            module = importlib.import_module(package)
            if head == package:
                target = module
            elif hasattr(module, head):
                target = getattr(module, head)
            if target is not None:
                break
    for part in rest:
        target = getattr(target, part, None)
    return target


def is_coroutine(target: Any) -> bool:
    return inspect.iscoroutinefunction(inspect.unwrap(target)) if callable(target) else False


def signature(target: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


class Calls(ast.NodeVisitor):
    """The calls of a block whose target is the packages', with what each binds to."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.names: dict[str, Any] = {}
        self.instances: dict[str, type] = {}
        self.awaited: set[int] = set()
        self.problems: list[Problem] = []

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] in PACKAGES:
            module = importlib.import_module(node.module)
            for alias in node.names:
                found = getattr(module, alias.name, None)
                if found is None:
                    self.fail(node, f"{node.module} has no {alias.name}")
                self.names[alias.asname or alias.name] = found

    def bind_instance(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name) and isinstance(value, ast.Call):
            made = self.target(value.func)
            if inspect.isclass(made):
                self.instances[target.id] = made

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.bind_instance(target, node.value)
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self.bind_instance(node.optional_vars, node.context_expr)
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self.awaited.add(id(node.value))
        self.generic_visit(node)

    def target(self, func: ast.expr) -> Any:
        if isinstance(func, ast.Name):
            return self.names.get(func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = self.instances.get(func.value.id) or self.names.get(func.value.id)
            return getattr(owner, func.attr, None) if owner is not None else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        target = self.target(node.func)
        if target is not None and callable(target):
            self.check(node, target)
        self.generic_visit(node)

    def check(self, node: ast.Call, target: Callable[..., Any]) -> None:
        name = ast.unparse(node.func)
        awaited = id(node) in self.awaited
        if is_coroutine(target) and not awaited:
            self.fail(node, f"{name}() is a coroutine function: write `await {name}(...)`")
        if awaited and not is_coroutine(target) and not inspect.isclass(target):
            self.fail(node, f"{name}() is not a coroutine function: drop the `await`")
        spread = any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        )
        found = signature(target)
        if spread or found is None:
            return
        # A method looked up on an instance's class still wants its self.
        owner = node.func.value if isinstance(node.func, ast.Attribute) else None
        bound_self = isinstance(owner, ast.Name) and owner.id in self.instances
        placeholders = [None] * (len(node.args) + (1 if bound_self else 0))
        try:
            found.bind(*placeholders, **{k.arg: None for k in node.keywords if k.arg})
        except TypeError as exc:
            self.fail(node, f"{name}{found}: {exc}")

    def fail(self, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        self.problems.append(Problem(f"{self.where} (block line {line})", what))


def named(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else page.name


def blocks(page: Path) -> Iterator[tuple[str, str]]:
    text = page.read_text("utf-8")
    for match in PYTHON.finditer(text):
        line = text.count("\n", 0, match.start("body")) + 1
        yield f"{named(page)}:{line}", match.group("body")


def block_problems(page: Path) -> list[Problem]:
    problems: list[Problem] = []
    for where, body in blocks(page):
        flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = compile(body, where, "exec", flags=flags)
        calls = Calls(where)
        calls.visit(tree)
        problems.extend(calls.problems)
    return problems


def inline_problems(page: Path) -> list[Problem]:
    """Calls in running text (outside code blocks): a coroutine must be shown awaited."""
    prose = FENCE.sub("", page.read_text("utf-8"))
    problems = []
    for match in INLINE_CALL.finditer(prose):
        target = resolve(match.group("name"), {})
        if target is None or not callable(target):
            continue
        awaited = match.group("await") is not None
        if is_coroutine(target) != awaited:
            what = "a coroutine: show it awaited" if not awaited else "not a coroutine"
            problems.append(Problem(named(page), f"{match.group(0)} is {what}"))
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[page.parent.name for page in PAGES])
def test_every_python_call_in_the_readme_matches_the_real_signature_and_awaits_coroutines(
    page: Path,
) -> None:
    assert list(blocks(page)), f"{page}: no python block found: the extraction is broken"
    assert block_problems(page) + inline_problems(page) == []


def test_the_check_finds_a_coroutine_shown_without_await_and_a_wrong_argument(
    tmp_path: Path,
) -> None:
    page = tmp_path / "README.md"
    page.write_text(
        "Erase with `outbox_core.erase_subject(conn, account)`.\n\n"
        "```python\nfrom outbox_issues import aget_filing, submit_report\n"
        "from outbox_feedback import FeedbackSendQueue\n\n"
        'aget_filing(conn, "r1")\nsubmit_report(conn, report="r1")\n'
        'sends = FeedbackSendQueue()\nsends.aqueue(conn, "fb-1")\nawait sends.queue(conn, "x")\n'
        "```\n",
        "utf-8",
    )
    found = [problem.what for problem in block_problems(page) + inline_problems(page)]
    assert len(found) == 5, found
    assert "write `await aget_filing(...)`" in found[0]
    assert "submit_report" in found[1] and "'report_id'" in found[1]
    assert "write `await sends.aqueue(...)`" in found[2]
    assert "sends.queue() is not a coroutine function" in found[3]
    assert "erase_subject" in found[4]
