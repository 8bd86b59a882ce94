"""The pytest plugin of outbox-slack (entry point ``pytest11: outbox_slack``).

- ``slack_server``: a started :class:`~outbox_slack.testing.SlackTestServer` for one test,
  with one channel ``C0TEST`` the bot is a member of.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing.server import SlackTestServer


@pytest.fixture
def slack_server() -> Iterator[SlackTestServer]:
    """A Slack Web API server on loopback that records what it was sent; tell it how to fail."""
    from .testing.server import SlackTestServer

    with SlackTestServer() as server:
        server.add_channel("C0TEST", name="general")
        yield server
