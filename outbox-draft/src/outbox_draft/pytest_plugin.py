"""The pytest plugin of outbox-draft (entry point ``pytest11: outbox_draft``).

- ``model_server``: a started :class:`~outbox_draft.testing.ModelTestServer` for one test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing.server import ModelTestServer


@pytest.fixture
def model_server() -> Iterator[ModelTestServer]:
    """An OpenAI-compatible chat-completions server on loopback that records every request;
    tell it how to answer."""
    from .testing.server import ModelTestServer

    with ModelTestServer() as server:
        yield server
