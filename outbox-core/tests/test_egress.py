"""The egress rule: only the executor calls an adapter's execute() (OutboundEgressArchitectureTest)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from outbox_core import ActionAdapter, EgressViolation

from .kinds import FencedAdapter

REPO = Path(__file__).resolve().parents[2]
ALLOWED = REPO / "outbox-core" / "src" / "outbox_core" / "executor"


def adapter_execute_calls(path: Path) -> list[int]:
    """Lines that call `.execute(...)` on something named like an adapter, or call
    `ActionAdapter.execute` / `<AdapterClass>.execute` directly."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "execute"
        ):
            continue
        target = node.func.value
        name = (
            target.id
            if isinstance(target, ast.Name)
            else target.attr
            if isinstance(target, ast.Attribute)
            else ""
        )
        if "adapter" in name.lower() or (
            isinstance(target, ast.Call) and "adapter" in ast.unparse(target).lower()
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_but_the_executor_calls_an_adapters_execute() -> None:
    sources = sorted(REPO.glob("outbox-*/src/**/*.py"))
    assert sources, "found no package sources to check"
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sources
        if ALLOWED not in path.parents
        for line in adapter_execute_calls(path)
    ]
    assert offenders == []


def test_the_checker_finds_a_call(tmp_path: Path) -> None:
    sample = tmp_path / "sneaky.py"
    sample.write_text("async def f(adapter, attempt):\n    return await adapter.execute(attempt)\n")
    assert adapter_execute_calls(sample) == [2]


async def test_calling_execute_outside_the_executor_raises() -> None:
    with pytest.raises(
        EgressViolation, match=r"FencedAdapter.execute\(\) was called outside the executor"
    ):
        await FencedAdapter().execute(None)  # type: ignore[arg-type]


def test_every_adapter_subclass_is_guarded() -> None:
    class Late(ActionAdapter):
        kind = "TEST_LATE"

        async def execute(self, attempt):  # type: ignore[no-untyped-def]
            return None

    assert getattr(Late.execute, "_outbox_guarded", False)
