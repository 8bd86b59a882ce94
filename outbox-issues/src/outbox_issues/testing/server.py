"""``GitHubTestServer``: a stateful GitHub-compatible HTTP server on loopback.

It implements what :class:`~outbox_issues.tracker.GitHubTracker` calls, with GitHub's status
codes, error bodies and headers: the REST API v3 under ``/api/v3`` (issues with the
``creator``, ``state`` and ``since`` filters and ``Link`` pagination, issue comments,
pull-request review comments, ``GET /user``) and GraphQL at ``/api/graphql`` (the node of an
issue, a repository's id, ``transferIssue``, ``deleteIssue``) with GraphQL's error shape at
HTTP 200. The URLs are GitHub Enterprise Server's, so the client's GHES path is the one tested.

Faults, each for the next ``times`` requests of one operation (``create_issue``,
``list_issues``, ``get_issue``, ``update_issue``, ``create_comment``, ``delete_comment``,
``user``, ``graphql:transferIssue``, ``graphql:deleteIssue``, ``graphql:node``,
``graphql:repository``, ...): :meth:`~GitHubTestServer.fail` (any status and body),
:meth:`~GitHubTestServer.primary_limit` and :meth:`~GitHubTestServer.secondary_limit` as
GitHub sends them, :meth:`~GitHubTestServer.drop` (the connection closed before the request
is recorded, or after: accept-then-drop), :meth:`~GitHubTestServer.stall` (no answer until the
client gives up, recorded or not), :meth:`~GitHubTestServer.hold` (recorded, answered once
released), :meth:`~GitHubTestServer.graphql_error`, :meth:`~GitHubTestServer.remove_repository`
and :meth:`~GitHubTestServer.hide_new_issues` (new issues missing from listings until
:meth:`~GitHubTestServer.reveal_issues`); and :meth:`~GitHubTestServer.refuse_connections`
(the tracker unreachable: connections refused until :meth:`~GitHubTestServer.
accept_connections`) and :meth:`~GitHubTestServer.ignore_creator_filter` (every author's
issues listed, as a GitHub-compatible server without that filter lists them), and
:meth:`~GitHubTestServer.make_unreadable` (a read outage: every read a 503 or a dropped
connection, for some seconds or until :meth:`~GitHubTestServer.make_readable`). It counts
writes, per action marker too.

Authors are GitHub's: a token whose login is a bot's (``<slug>[bot]``) is an App installation
token, refused at ``GET /user`` (403) and answered by GraphQL's ``viewer``; its writes carry
``performed_via_github_app``. :meth:`~GitHubTestServer.refuse_deletes` refuses every
``deleteIssue`` the ways GitHub does (``FORBIDDEN``, a schema without it, a 404).
``add_issue``, ``add_comment`` and ``add_review_comment`` seed
entries as another account (``user=OTHER_LOGIN``): a marker planted by someone else.

Its start and stop, recording, drops, stalls and refused connections are the core's loopback
base (:class:`outbox_core.testing.loopback_http.LoopbackHTTPServer`), its faults the core's
(:mod:`outbox_core.testing.faults`). What it holds and GitHub's JSON are in
:mod:`outbox_issues.testing.github_state`, the REST routes in :mod:`outbox_issues.testing.rest`
and GraphQL in :mod:`outbox_issues.testing.graphql`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

from outbox_core.testing.faults import Fault, FaultQueue, Outage
from outbox_core.testing.loopback_http import Answer, Exchange, LoopbackHTTPServer, Received

from ..settings import IssuesSettings
from .github_state import (
    DOCS,
    LOGIN,
    OTHER_LOGIN,
    PRIVATE,
    PUBLIC,
    TOKEN,
    DeleteRefusal,
    GitHubState,
    StoredComment,
    StoredIssue,
    Write,
    error,
    iter_markers,
)
from .graphql import READS, GraphQLAPI
from .rest import RestAPI

__all__ = [
    "LOGIN",
    "OTHER_LOGIN",
    "PRIVATE",
    "PUBLIC",
    "TOKEN",
    "Fault",
    "GitHubTestServer",
    "StoredComment",
    "StoredIssue",
    "Write",
    "iter_markers",
]

ReadOutage = Literal["5xx", "drop"]
"""How reads fail in an outage (:meth:`GitHubTestServer.make_unreadable`)."""


class GitHubTestServer(LoopbackHTTPServer, GitHubState):
    """Start with ``with GitHubTestServer() as server:`` (or :meth:`start`/:meth:`stop`)."""

    thread_name = "github-test-server"
    server_version = "GitHub.com"
    json_content_type = "application/json; charset=utf-8"

    def __init__(
        self,
        *,
        login: str = LOGIN,
        token: str = TOKEN,
        repositories: tuple[str, ...] = (PUBLIC, PRIVATE),
        stall_seconds: float = 30.0,
    ) -> None:
        LoopbackHTTPServer.__init__(self, stall_seconds=stall_seconds)
        GitHubState.__init__(self, login=login, repositories=repositories)
        self.token = token
        self.requests: list[tuple[str, str]] = []
        self.queries: list[tuple[str, str, dict[str, str]]] = []
        """Every request's method, path and query parameters."""
        self.faults: FaultQueue[Fault] = FaultQueue()
        self.outage: Outage | None = None
        """While set by :meth:`make_unreadable`: how reads fail (``how``), and until when."""
        self.held = threading.Event()
        """Set while a held request waits for :meth:`release`."""
        self._rest = RestAPI(self)
        self._graphql = GraphQLAPI(self)

    @property
    def base_url(self) -> str:
        return self.origin

    @property
    def api_url(self) -> str:
        """The REST base URL, as GitHub Enterprise Server has it (``/api/v3``)."""
        return f"{self.base_url}/api/v3"

    def settings(self, **overrides: Any) -> IssuesSettings:
        """Settings that reach this server (short timeouts), with ``overrides``."""
        values: dict[str, Any] = {
            "api_url": self.api_url,
            "token": self.token,
            "repository": PUBLIC,
            "private_repository": PRIVATE if PRIVATE in self.repositories else None,
            "connect_timeout_seconds": 2.0,
            "request_timeout_seconds": 2.0,
        }
        values.update(overrides)
        return IssuesSettings(**values)

    # -- faults --------------------------------------------------------------------------------

    # -- faults --------------------------------------------------------------------------------

    def fail(
        self,
        op: str,
        status: int,
        message: str = "Server Error",
        *,
        headers: dict[str, str] | None = None,
        body: Any = None,
        times: int = 1,
    ) -> None:
        """Answer ``status`` with GitHub's error body, recording nothing."""
        payload = body if body is not None else {"message": message, "documentation_url": DOCS}
        self._add(Fault(op, "status", times, status, payload, headers or {}))

    def primary_limit(self, op: str, *, reset_in: float = 30.0, status: int = 403) -> None:
        """GitHub's primary rate limit: 403 (or 429), ``x-ratelimit-remaining: 0``."""
        reset = int(time.time() + reset_in)
        self.fail(
            op,
            status,
            "API rate limit exceeded for user ID 1.",
            headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)},
        )

    def secondary_limit(
        self, op: str, *, retry_after: int | None = None, status: int = 403
    ) -> None:
        """GitHub's secondary rate limit: 403 (or 429) saying so, ``retry-after`` if given;
        the primary limit's headers show requests left, as GitHub's do."""
        headers = {} if retry_after is None else {"retry-after": str(retry_after)}
        self.fail(
            op,
            status,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you "
            "try again. If you reach out to GitHub Support for help, please include the "
            "request ID 0000:0000:0000000:0000000:00000000.",
            headers=headers,
        )

    def validation_failed(self, op: str, field_name: str = "title") -> None:
        self.fail(
            op,
            422,
            body={
                "message": "Validation Failed",
                "errors": [{"resource": "Issue", "code": "invalid", "field": field_name}],
                "documentation_url": DOCS,
            },
        )

    def drop(self, op: str, *, after_recording: bool = False, times: int = 1) -> None:
        """Close the connection without an answer: before the request is recorded (nothing
        written), or after (accept-then-drop: the write exists)."""
        self._add(Fault(op, "drop_after" if after_recording else "drop_before", times))

    def stall(self, op: str, *, after_recording: bool = False, times: int = 1) -> None:
        """Answer nothing until the client gives up (or ``stall_seconds``)."""
        self._add(Fault(op, "stall_after" if after_recording else "stall_before", times))

    def hold(self, op: str) -> None:
        """Record the next ``op``, then wait for :meth:`release` before answering it."""
        self.rearm()
        self.held.clear()
        self._add(Fault(op, "hold"))

    def graphql_error(self, op: str, error_type: str, message: str | None = None) -> None:
        """GraphQL's failure: HTTP 200 with ``errors`` of ``error_type`` (``RATE_LIMITED``
        with the primary limit's headers)."""
        text = message or {
            "RATE_LIMITED": "API rate limit exceeded for user ID 1.",
            "NOT_FOUND": "Could not resolve to a node with the global id of 'x'.",
            "FORBIDDEN": "Resource not accessible by integration",
        }.get(error_type, "Something went wrong while executing your query.")
        headers = (
            {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time() + 30))}
            if error_type == "RATE_LIMITED"
            else {}
        )
        body = {"data": None, "errors": [{"type": error_type, "message": text}]}
        self._add(Fault(op, "status", 1, 200, body, headers))

    def remove_repository(self, name: str) -> None:
        """Every request on the repository answers 404 from now on."""
        with self.lock:
            self.repositories[name].gone = True

    def hide_new_issues(self) -> None:
        """Issues created from now on are missing from listings until :meth:`reveal_issues`
        (GitHub's listings lag behind a new issue)."""
        with self.lock:
            self.new_issues.hide(until_revealed=True)

    def reveal_issues(self) -> None:
        with self.lock:
            self.new_issues.show()
            for issue in self.issues.values():
                issue.hidden = False

    def ignore_creator_filter(self) -> None:
        """List every author's issues whatever ``creator`` asks for, as a GitHub-compatible
        server that does not implement that filter does, until :meth:`clear_faults`."""
        with self.lock:
            self.creator_ignored = True

    def make_unreadable(self, seconds: float | None = None, *, how: ReadOutage = "5xx") -> None:
        """A read outage: every read (each GET: listings, an issue, ``GET /user``; GraphQL's
        node, repository and viewer queries) fails for ``seconds`` (None: until
        :meth:`make_readable` or :meth:`clear_faults`), as GitHub's do: ``5xx``, a 503 with
        GitHub's error body; ``drop``, the connection closed without an answer. Writes are
        answered as ever."""
        with self.lock:
            self.outage = Outage.lasting(seconds, how=how)

    def make_readable(self) -> None:
        with self.lock:
            self.outage = None

    def unreadable(self, method: str, op: str) -> ReadOutage | None:
        """How a read of ``op`` fails now (None: it is answered)."""
        with self.lock:
            outage = self.outage
        if outage is None or not (method == "GET" or op in READS) or not outage.covers(op):
            return None
        how: ReadOutage = outage.how  # type: ignore[assignment]
        return how

    def refuse_deletes(self, how: DeleteRefusal = "forbidden") -> None:
        """Refuse every GraphQL ``deleteIssue`` until :meth:`clear_faults`, deleting nothing,
        as GitHub does: ``forbidden``, a token without admin rights on the repository (HTTP
        200, an error of type ``FORBIDDEN``); ``missing``, a schema without the mutation (an
        older GitHub Enterprise Server, a compatible server: ``undefinedField``, no type);
        ``not_found``, no GraphQL endpoint at that URL (HTTP 404)."""
        with self.lock:
            self.deletes_refused = how

    def clear_faults(self) -> None:
        self.faults.clear()
        with self.lock:
            self.creator_ignored = False
            self.deletes_refused = None
            self.outage = None
        self.reveal_issues()
        self.release()
        self.accept_connections()

    def _add(self, fault: Fault) -> None:
        self.faults.add(fault.op, fault, fault.times)

    def take_fault(self, op: str) -> Fault | None:
        return self.faults.take(op)

    # -- dispatch ------------------------------------------------------------------------------

    def answer_headers(self, path: str) -> dict[str, str]:
        return {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "4999",
            "x-ratelimit-reset": str(int(time.time()) + 3600),
            "x-ratelimit-used": "1",
            "x-ratelimit-resource": "graphql" if path.endswith("/graphql") else "core",
            "x-github-media-type": "github.v3; format=json",
        }

    def serve(self, request: Received, exchange: Exchange) -> None:
        method, path, query = request.method, request.path, request.query
        try:
            payload = request.json()
        except ValueError:
            raise error(400, "Problems parsing JSON") from None
        with self.lock:
            self.requests.append((method, path))
            self.queries.append((method, path, query))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise error(401, "Bad credentials")
        if path == "/api/graphql" and method == "POST":
            route, handler = self._graphql.route(payload)
        else:
            route, handler = self._rest.route(method, path)
        outage = self.unreadable(method, route)
        if outage == "5xx":
            raise error(503, "Service Unavailable")
        if outage == "drop":
            exchange.drop()
            return
        fault = self.take_fault(route)
        if fault is not None and fault.mode == "status":
            raise Answer(fault.status, fault.body, fault.headers)
        if fault is not None and fault.mode in ("drop_before", "stall_before"):
            if fault.mode == "stall_before":
                self.stall_here()
            exchange.drop()
            return
        with self.lock:
            status, body, headers = handler(query, payload)
        if fault is not None and fault.mode == "hold":
            self.held.set()
            self.stall_here()
        if fault is not None and fault.mode in ("drop_after", "stall_after"):
            if fault.mode == "stall_after":
                self.stall_here()
            exchange.drop()
            return
        exchange.send(status, body, headers)
