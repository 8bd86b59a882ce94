"""Test the issue kinds against a real HTTP server on loopback that speaks GitHub's API.

- :class:`GitHubTestServer`: issues, comments, review comments, GraphQL transfer and delete,
  with GitHub's status codes, error bodies, rate-limit headers and ``Link`` pagination, and
  faults on demand (rate limits, 5xx, accept-then-drop, stall, 422, a repository gone, new
  issues hidden from listings). It counts writes, per action marker too.
- :func:`serve_issues`: point the four kinds in an ``outbox_db`` test database at that server.
- :class:`IssuesProvider` and :func:`conformance_target`: the server and the requests as the
  core's adapter conformance suite (``outbox_core.testing.conformance``) steers them.
- The pytest fixture ``tracker_server`` (loaded with the package's ``pytest11`` entry point).

Only the standard library: ``pip install outbox-issues`` is enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..adapter import ADAPTERS, TrackerAdapter
from . import server
from .provider import IssuesProvider
from .server import *  # noqa: F403 (the names of server.__all__)
from .server import PUBLIC, GitHubTestServer

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase
    from outbox_core.testing.conformance import ConformanceTarget

A = TypeVar("A", bound=TrackerAdapter)

# The fake's own names are listed once, in server.__all__; this module adds its helpers.
__all__ = ["IssuesProvider", "bind_kinds", "conformance_target", "serve_issues"]
__all__ += server.__all__


def bind_kinds(
    db: OutboxTestDatabase, adapters: Sequence[type[A]], settings: Any, distribution: str
) -> list[type[A]]:
    """Register ``adapters`` bound to ``settings`` in this test's database in place of the
    registered ones (keeping their distribution and version). Returns the bound classes."""
    return [
        db.replace_adapter(adapter.bind(settings), distribution=distribution)
        for adapter in adapters
    ]


def serve_issues(
    db: OutboxTestDatabase, server: GitHubTestServer, **settings: Any
) -> list[type[TrackerAdapter]]:
    """Make ``FILE_ISSUE``, ``PUBLISH_REPORT``, ``CLEANUP_ISSUE`` and ``TRANSFER_ISSUE`` in this
    test's database talk to ``server`` (``settings`` override the server's defaults, e.g.
    ``listing_lag_seconds=0``). Returns the adapter classes now registered."""
    return bind_kinds(db, ADAPTERS, server.settings(**settings), "outbox-issues")


def conformance_target(
    db: OutboxTestDatabase, server: GitHubTestServer, kind: str
) -> ConformanceTarget:
    """The suite's target for ``kind``: the four kinds in ``db`` served by ``server`` (a
    listing proves a write absent at once: the loopback tracker's listings do not lag unless
    told to), the provider, and its request factory."""
    from outbox_core.testing.conformance import ConformanceTarget

    serve_issues(db, server, listing_lag_seconds=0.0)
    provider = IssuesProvider(server, kind)
    # What an operator's resolve --done names: an issue's URL, as a filing's read-back.
    return ConformanceTarget.of(
        db, kind, provider, resolved_ref=f"{server.base_url}/{PUBLIC}/issues/1"
    )
