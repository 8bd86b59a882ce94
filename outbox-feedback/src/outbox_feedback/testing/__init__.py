"""Test the feedback kinds against outbox-issues' loopback tracker
(:class:`outbox_issues.testing.GitHubTestServer`: pull requests, conversation comments and review
comments with GitHub's status codes, error bodies, rate-limit headers, ``Link`` pagination and
faults, such as accept-then-drop on ``create_comment`` or ``create_review_comment``).

- :func:`serve_feedback`: point the three kinds in an ``outbox_db`` test database at a server.
- :func:`copies_on`: what the server holds of a feedback, by copy marker.
- :class:`FeedbackProvider` and :func:`conformance_target`: the server and the requests as the
  core's adapter conformance suite steers them.
- The pytest fixture ``tracker_server`` comes with outbox-issues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox_issues.testing import GitHubTestServer, bind_kinds

from ..adapter import ADAPTERS, FeedbackAdapter
from ..copies import copy_marker
from .provider import FeedbackProvider

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase
    from outbox_core.testing.conformance import ConformanceTarget
    from outbox_issues.testing.server import StoredComment

__all__ = ["FeedbackProvider", "conformance_target", "copies_on", "serve_feedback"]


def serve_feedback(
    db: OutboxTestDatabase, server: GitHubTestServer, **settings: Any
) -> list[type[FeedbackAdapter]]:
    """Make ``DELIVER_FEEDBACK``, ``EDIT_FEEDBACK`` and ``RETRACT_FEEDBACK`` in this test's
    database talk to ``server`` (``settings`` override the server's defaults; a listing proves
    a copy absent at once unless ``listing_lag_seconds`` says otherwise). Returns the adapter
    classes now registered."""
    tracker = server.settings(**{"listing_lag_seconds": 0.0, **settings})
    return bind_kinds(db, ADAPTERS, tracker, "outbox-feedback")


def copies_on(
    server: GitHubTestServer, repository: str, pull: int, feedback_id: str
) -> dict[str, list[StoredComment]]:
    """Every comment and review comment on the pull request that carries a copy marker of
    this feedback, by item (``"summary"`` and the inline items' ids)."""
    prefix = copy_marker(feedback_id, "").removesuffix(" -->")
    found: dict[str, list[StoredComment]] = {}
    with server.lock:
        comments = [
            *server.comments_on(repository, pull),
            *server.review_comments_on(repository, pull),
        ]
    for comment in comments:
        for line in comment.body.splitlines():
            if line.startswith(prefix) and line.endswith(" -->"):
                item = line[len(prefix) : -len(" -->")]
                found.setdefault(item, []).append(comment)
    return found


def conformance_target(
    db: OutboxTestDatabase, server: GitHubTestServer, kind: str
) -> ConformanceTarget:
    """The suite's target for ``kind``: the three kinds in ``db`` served by ``server``, the
    provider, and its request factory."""
    from outbox_core.testing.conformance import ConformanceTarget

    serve_feedback(db, server)
    provider = FeedbackProvider(server, kind)
    return ConformanceTarget.of(db, kind, provider)
