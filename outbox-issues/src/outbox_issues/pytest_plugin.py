"""The pytest plugin of outbox-issues (entry point ``pytest11: outbox_issues``).

- ``tracker_server``: a started :class:`~outbox_issues.testing.GitHubTestServer` for one test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing.server import GitHubTestServer


@pytest.fixture
def tracker_server() -> Iterator[GitHubTestServer]:
    """A GitHub-compatible tracker on loopback that records what it holds; tell it how to fail."""
    from .testing.server import GitHubTestServer

    with GitHubTestServer() as server:
        yield server
