"""Test the SLACK_POST kind against a real Slack Web API server on loopback.

- :class:`SlackTestServer`: a stateful Slack Web API (``auth.test``, ``chat.postMessage``,
  ``conversations.history``, ``conversations.replies``) that records every post and fails on
  demand (``ok: false`` errors, 429 with ``Retry-After``, 5xx, a drop before or after recording
  a post, a stall, a broken cursor, hidden new posts, the non-Marketplace history limits, a
  read-back outage, warnings and the 40,000-character cut, markers planted by others).
- :func:`serve_slack`: point ``SLACK_POST`` in an ``outbox_db`` test database at that server.
- :class:`SlackProvider` and :func:`conformance_request`: the server and the requests as the
  core's adapter conformance suite reads them.
- The pytest fixture ``slack_server`` (loaded with the package's ``pytest11`` entry point).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..adapter import SlackPostAdapter
from .conversations import METHODS, TOKEN, Channel, Message
from .provider import SlackProvider, conformance_request
from .server import SlackTestServer

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase

__all__ = [
    "METHODS",
    "TOKEN",
    "Channel",
    "Message",
    "SlackProvider",
    "SlackTestServer",
    "conformance_request",
    "serve_slack",
]


def serve_slack(
    db: OutboxTestDatabase,
    server: SlackTestServer,
    *,
    adapter_values: Mapping[str, Any] | None = None,
    **settings: Any,
) -> type[SlackPostAdapter]:
    """Make ``SLACK_POST`` in this test's database post to ``server`` (``settings`` override
    the server's defaults, e.g. ``readback_window_seconds=0``; ``adapter_values`` the adapter's
    class values, e.g. ``{"unreadable_for": timedelta(seconds=5)}``). Returns the adapter class
    now registered; ``db.drain()`` and ``db.outbox`` use it."""
    bound = SlackPostAdapter.bind(
        settings=server.settings(**settings), **dict(adapter_values or {})
    )
    return db.replace_adapter(bound, distribution="outbox-slack")
