"""The pytest plugin of outbox-email (entry point ``pytest11: outbox_email``).

- ``smtp_server``: a started :class:`~outbox_email.testing.SmtpTestServer` for one test.

aiosmtpd is imported only when the fixture is used, so installing outbox-email without its
``test`` extra never breaks a pytest run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing.server import SmtpTestServer


@pytest.fixture
def smtp_server() -> Iterator[SmtpTestServer]:
    """An SMTP server on loopback that records what it received; tell it how to fail."""
    from .testing.server import SmtpTestServer

    with SmtpTestServer() as server:
        yield server
