"""The hosts tests skip, with one line, where this machine cannot make network namespaces."""

from __future__ import annotations

import pytest

from .network import unavailable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [item for item in items if item.path.parent.name == "hosts"]
    why = unavailable() if ours else None
    for item in ours if why else []:
        item.add_marker(pytest.mark.skip(reason=f"no network namespaces: {why}"))
