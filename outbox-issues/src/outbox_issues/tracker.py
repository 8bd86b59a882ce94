"""``GitHubTracker``: an async client of the GitHub REST API v3 and the part of GraphQL that a
transfer and a delete need, over ``httpx``. The one tracker client of outbox: the issue kinds
use it, and so will ``outbox-feedback`` (issue and pull-request comments, review comments).

- The base URL is configurable: ``https://api.github.com``, or ``https://<host>/api/v3`` for
  GitHub Enterprise Server, whose GraphQL endpoint is ``https://<host>/api/graphql``.
- Listings follow the ``Link: <...>; rel="next"`` header page by page; ``find_*`` look for a
  marker in every page and say whether the listing was complete.
- A marker is read back only from what the token itself wrote: every ``find_*`` matches the
  entry's author (``user.login``) against :meth:`GitHubTracker.identity`, the identity the
  token writes as, found once per client and kept. An entry carrying the marker from anyone
  else is ignored and reported in ``Found.foreign`` (markers are predictable: anyone who can
  comment can plant one).
- Responses are typed (pydantic models that ignore fields they do not name).
- Failures are typed by what they prove (:class:`NotSent`, :class:`Unanswered`,
  :class:`RateLimited`, :class:`Refused`, :class:`GraphQLRefused`), so an adapter maps them
  to results in one place.
- The client never retries a request on its own, and follows no redirect: a write that an
  HTTP layer repeats could write twice, and a transferred issue's REST URL answers 301.

The client is one class built of one module per seam: :mod:`.tracker_wire` (the connection,
one request, GraphQL's wire, the token's identity), :mod:`.tracker_listings` (pages and marker
read-backs), :mod:`.tracker_rest` (issues, comments, review comments), :mod:`.tracker_graphql`
(transfers and deletes); the answers are typed in :mod:`.tracker_models`, the failures in
:mod:`.tracker_errors`. Every name is importable from here, as before.

httpx is imported when a client is made, not when this module is imported.
"""

from __future__ import annotations

from .tracker_errors import (
    SECONDARY_LIMIT_MINIMUM,
    GraphQLRefused,
    NotSent,
    RateLimited,
    Refused,
    TrackerError,
    Unanswered,
    http_detail,
    rate_limit,
    said,
)
from .tracker_graphql import GraphQLCalls
from .tracker_models import (
    Comment,
    Found,
    Issue,
    IssueNode,
    Label,
    Repository,
    ReviewComment,
    User,
    same_login,
)
from .tracker_rest import RestCalls
from .tracker_wire import API_VERSION, USER_AGENT

__all__ = [
    "API_VERSION",
    "SECONDARY_LIMIT_MINIMUM",
    "USER_AGENT",
    "Comment",
    "Found",
    "GitHubTracker",
    "GraphQLRefused",
    "Issue",
    "IssueNode",
    "Label",
    "NotSent",
    "RateLimited",
    "Refused",
    "Repository",
    "ReviewComment",
    "TrackerError",
    "Unanswered",
    "User",
    "http_detail",
    "rate_limit",
    "said",
    "same_login",
]


class GitHubTracker(RestCalls, GraphQLCalls):
    """One tracker, one token. Use ``async with`` or call :meth:`aclose`.

    ``transport`` replaces the network (tests); the client never retries and never follows
    redirects, whatever transport it is given. ``identity`` is the login the token writes as
    when the settings say it (``OUTBOX_ISSUES_WRITER_LOGIN``, or ``<slug>[bot]`` for
    ``OUTBOX_ISSUES_APP_SLUG``); unset, :meth:`identity` asks the tracker once."""
