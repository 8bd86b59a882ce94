"""Test your notices and the EMAIL kind against a real SMTP server on loopback.

- :class:`SmtpTestServer`: an aiosmtpd relay that records what it received and fails on
  demand (refused connection, AUTH failure, 421/451/550 at any stage, a drop after the
  content, a stall).
- :class:`SmtpProvider`: that server as the core's adapter conformance suite reads and steers
  it (``outbox_core.testing.conformance``).
- :func:`serve_email`: point ``EMAIL`` in an ``outbox_db`` test database at that server,
  optionally with the notices of one test.
- The pytest fixture ``smtp_server`` (loaded with the package's ``pytest11`` entry point).

Needs ``aiosmtpd``: ``pip install 'outbox-email[test]'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..adapter import KIND, EmailAdapter
from ..notices import EmailNotice, NoticeRegistry
from .provider import SmtpProvider
from .server import SENDER, STAGES, ReceivedMessage, SmtpTestServer, Stage

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase

__all__ = [
    "SENDER",
    "STAGES",
    "ReceivedMessage",
    "SmtpProvider",
    "SmtpTestServer",
    "Stage",
    "serve_email",
]


def serve_email(
    db: OutboxTestDatabase,
    server: SmtpTestServer,
    *,
    notices: Iterable[EmailNotice[Any]] | NoticeRegistry | None = None,
    **settings: Any,
) -> type[EmailAdapter]:
    """Make ``EMAIL`` in this test's database send to ``server`` (``settings`` override the
    server's defaults, e.g. ``reuse_connections=False``). ``notices`` replace the registered
    ones for this test; by default the notices the plugins registered are kept. Returns the
    adapter class now registered; ``db.drain()`` and ``db.outbox`` use it."""
    current = db.registry.get(KIND) if KIND in db.registry else None
    if notices is None:
        found = getattr(current.adapter, "notices", None) if current is not None else None
        registry = found if isinstance(found, NoticeRegistry) else NoticeRegistry()
    elif isinstance(notices, NoticeRegistry):
        registry = notices
    else:
        registry = NoticeRegistry(notices, source="(test)")
    bound = EmailAdapter.bind(registry, settings=server.settings(**settings))
    return db.replace_adapter(bound, distribution="outbox-email")
