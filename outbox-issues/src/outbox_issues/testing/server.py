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
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit

from ..limits import MAX_BODY, MAX_TITLE
from ..settings import IssuesSettings

DOCS = "https://docs.github.com/rest"
LOGIN = "outbox-bot"
OTHER_LOGIN = "mallory"
"""Another account: what it writes is never the token's own (plant markers with it)."""
TOKEN = "ghp_loopbacktesttoken"
PUBLIC, PRIVATE = "acme/feedback", "acme/private"
Mode = Literal["status", "drop_before", "drop_after", "stall_before", "stall_after", "hold"]
DeleteRefusal = Literal["forbidden", "missing", "not_found"]
Outage = Literal["5xx", "drop"]
_READS = frozenset({"graphql:node", "graphql:repository", "graphql:viewer"})
"""The GraphQL operations that only read (with every GET, what an outage makes unreadable)."""
_MARKER = re.compile(r"<!-- outbox:action (\S+) -->")


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _node(kind: str, number: int) -> str:
    return base64.b64encode(f"0:{kind}{number}".encode()).decode().rstrip("=")


@dataclass
class Fault:
    op: str
    mode: Mode
    times: int = 1
    status: int = 500
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StoredIssue:
    id: int
    node_id: str
    number: int
    repository: str
    title: str
    body: str
    labels: list[str]
    user: str
    created_at: datetime
    updated_at: datetime
    state: str = "open"
    hidden: bool = False
    deleted: bool = False
    pull: bool = False
    edits: list[str] = field(default_factory=list)
    """Every earlier body (GitHub's edit history keeps them)."""


@dataclass
class StoredComment:
    id: int
    node_id: str
    repository: str
    number: int
    body: str
    user: str
    created_at: datetime
    updated_at: datetime
    review: bool = False
    path: str | None = None
    commit_id: str | None = None
    line: int | None = None
    side: str | None = None


@dataclass(frozen=True)
class Write:
    """One write the server recorded: the operation and the action markers in its body."""

    op: str
    target: str
    markers: tuple[str, ...]


@dataclass
class _Repository:
    name: str
    node_id: str
    next_number: int = 1
    gone: bool = False


class GitHubTestServer:
    """Start with ``with GitHubTestServer() as server:`` (or :meth:`start`/:meth:`stop`)."""

    def __init__(
        self,
        *,
        login: str = LOGIN,
        token: str = TOKEN,
        repositories: tuple[str, ...] = (PUBLIC, PRIVATE),
        stall_seconds: float = 30.0,
    ) -> None:
        self.login = login
        self.token = token
        self.stall_seconds = stall_seconds
        self.lock = threading.RLock()
        self.repositories = {
            name: _Repository(name, _node("R_", index))
            for index, name in enumerate(repositories, start=1)
        }
        self.issues: dict[tuple[str, int], StoredIssue] = {}
        self.moved: dict[tuple[str, int], tuple[str, int]] = {}
        self.comments: dict[int, StoredComment] = {}
        self.writes: list[Write] = []
        self.requests: list[tuple[str, str]] = []
        self.queries: list[tuple[str, str, dict[str, str]]] = []
        """Every request's method, path and query parameters."""
        self.faults: list[Fault] = []
        self.hiding = False
        self.creator_ignored = False
        """True while :meth:`ignore_creator_filter` lists every author's issues."""
        self.outage: tuple[Outage, float] | None = None
        """While set by :meth:`make_unreadable`: how reads fail, and until when (monotonic)."""
        self.deletes_refused: DeleteRefusal | None = None
        """How :meth:`refuse_deletes` refuses every ``deleteIssue`` (None: it deletes)."""
        self.held = threading.Event()
        """Set while a held request waits for :meth:`release`."""
        self._release = threading.Event()
        self._ids = 1000
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self.refusing = False
        """True while :meth:`refuse_connections` keeps the door shut."""
        self._connections: set[socket.socket] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> GitHubTestServer:
        self._listen(0)
        return self

    def _listen(self, port: int) -> None:
        server = self

        class Handler(_Handler):
            tracker = server

        try:
            self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise RuntimeError(
                f"the loopback tracker could not listen on 127.0.0.1:{port} again ({exc}): "
                "another process took the port while its connections were refused"
            ) from exc
        self._httpd.daemon_threads = True
        self._port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="github-test-server", daemon=True
        )
        self._thread.start()

    def _close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def stop(self) -> None:
        self._release.set()
        self.refusing = False
        self._close()

    def __enter__(self) -> GitHubTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._port, "start the server first"
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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

    def refuse_connections(self) -> None:
        """The tracker is unreachable: its listening socket closes (a connection is refused
        before any request is sent, so it holds nothing of it) and its open connections are
        cut, until :meth:`accept_connections` listens on the same port again."""
        if self._port == 0 or self.refusing:
            return
        self.refusing = True
        self._close()
        with self.lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def accept_connections(self) -> None:
        """Listen again (on the same port) after :meth:`refuse_connections`."""
        if self.refusing:
            self._listen(self._port)
            self.refusing = False

    def hold(self, op: str) -> None:
        """Record the next ``op``, then wait for :meth:`release` before answering it."""
        self._release.clear()
        self.held.clear()
        self._add(Fault(op, "hold"))

    def release(self) -> None:
        self._release.set()

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
            self.hiding = True

    def reveal_issues(self) -> None:
        with self.lock:
            self.hiding = False
            for issue in self.issues.values():
                issue.hidden = False

    def ignore_creator_filter(self) -> None:
        """List every author's issues whatever ``creator`` asks for, as a GitHub-compatible
        server that does not implement that filter does, until :meth:`clear_faults`."""
        with self.lock:
            self.creator_ignored = True

    def make_unreadable(self, seconds: float | None = None, *, how: Outage = "5xx") -> None:
        """A read outage: every read (each GET: listings, an issue, ``GET /user``; GraphQL's
        node, repository and viewer queries) fails for ``seconds`` (None: until
        :meth:`make_readable` or :meth:`clear_faults`), as GitHub's do: ``5xx``, a 503 with
        GitHub's error body; ``drop``, the connection closed without an answer. Writes are
        answered as ever."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        with self.lock:
            self.outage = (how, until)

    def make_readable(self) -> None:
        with self.lock:
            self.outage = None

    def unreadable(self, method: str, op: str) -> Outage | None:
        """How a read of ``op`` fails now (None: it is answered)."""
        with self.lock:
            outage = self.outage
        if outage is None or not (method == "GET" or op in _READS):
            return None
        how, until = outage
        return how if time.monotonic() < until else None

    def refuse_deletes(self, how: DeleteRefusal = "forbidden") -> None:
        """Refuse every GraphQL ``deleteIssue`` until :meth:`clear_faults`, deleting nothing,
        as GitHub does: ``forbidden``, a token without admin rights on the repository (HTTP
        200, an error of type ``FORBIDDEN``); ``missing``, a schema without the mutation (an
        older GitHub Enterprise Server, a compatible server: ``undefinedField``, no type);
        ``not_found``, no GraphQL endpoint at that URL (HTTP 404)."""
        with self.lock:
            self.deletes_refused = how

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()
            self.creator_ignored = False
            self.deletes_refused = None
            self.outage = None
        self.reveal_issues()
        self.release()
        self.accept_connections()

    def _add(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def take_fault(self, op: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.op == op:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    # -- what it holds -------------------------------------------------------------------------

    def issues_in(self, repository: str, *, with_deleted: bool = False) -> list[StoredIssue]:
        with self.lock:
            return sorted(
                (
                    issue
                    for issue in self.issues.values()
                    if issue.repository == repository
                    and not issue.pull
                    and (with_deleted or not issue.deleted)
                ),
                key=lambda issue: issue.number,
            )

    def writes_for(self, key: str) -> int:
        """How many recorded writes carried the action marker of ``key``."""
        with self.lock:
            return sum(1 for write in self.writes if key in write.markers)

    def writes_of(self, op: str) -> int:
        with self.lock:
            return sum(1 for write in self.writes if write.op == op)

    def add_comment(
        self, repository: str, number: int, body: str, *, user: str | None = None
    ) -> int:
        """Seed a comment on an issue (as if posted by ``user``, by default the token's)."""
        with self.lock:
            return self._new_comment(repository, number, body, user or self.login).id

    def add_issue(
        self, repository: str, title: str, body: str, *, user: str | None = None
    ) -> StoredIssue:
        """Seed an issue (as if opened by ``user``, by default the token's): with
        ``user=OTHER_LOGIN`` and one of our markers in ``body``, a planted marker."""
        with self.lock:
            return self._new_issue(repository, title, body, [], user or self.login)

    def add_review_comment(
        self,
        repository: str,
        pull: int,
        body: str,
        *,
        user: str | None = None,
        path: str = "src/app.py",
        commit_id: str = "0" * 40,
        line: int = 1,
        side: str = "RIGHT",
    ) -> int:
        """Seed a review comment on a line of a pull request (as if by ``user``)."""
        with self.lock:
            return self._new_comment(
                repository,
                pull,
                body,
                user or self.login,
                review=True,
                path=path,
                commit_id=commit_id,
                line=line,
                side=side,
            ).id

    def add_pull_request(self, repository: str, title: str = "A change") -> int:
        with self.lock:
            issue = self._new_issue(repository, title, "", [], self.login)
            issue.pull = True
            return issue.number

    def move_issue(self, repository: str, number: int, target: str) -> StoredIssue:
        """Transfer an issue as GitHub does (a person in the UI, or ``transferIssue``): a new
        number in ``target``, the same node id, and the old URL answering 301."""
        with self.lock:
            issue = self.issues.pop((repository, number))
            repo = self.repositories[target]
            issue.repository, issue.number = target, repo.next_number
            repo.next_number += 1
            issue.updated_at = _now()
            self.issues[(target, issue.number)] = issue
            self.moved[(repository, number)] = (target, issue.number)
            return issue

    def comments_on(self, repository: str, number: int) -> list[StoredComment]:
        """The conversation comments of an issue or a pull request."""
        with self.lock:
            return [
                c
                for c in self.comments.values()
                if c.repository == repository and c.number == number and not c.review
            ]

    def review_comments_on(self, repository: str, pull: int) -> list[StoredComment]:
        """The review comments (on lines of the diff) of a pull request, oldest first."""
        with self.lock:
            return sorted(
                (
                    c
                    for c in self.comments.values()
                    if c.repository == repository and c.number == pull and c.review
                ),
                key=lambda c: c.id,
            )

    # -- state changes (under the lock) --------------------------------------------------------

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _new_issue(
        self, repository: str, title: str, body: str, labels: list[str], user: str
    ) -> StoredIssue:
        repo = self.repositories[repository]
        number = repo.next_number
        repo.next_number += 1
        moment = _now()
        issue = StoredIssue(
            id=self._next_id(),
            node_id="",
            number=number,
            repository=repository,
            title=title,
            body=body,
            labels=labels,
            user=user,
            created_at=moment,
            updated_at=moment,
            hidden=self.hiding,
        )
        issue.node_id = _node("I_", issue.id)
        self.issues[(repository, number)] = issue
        return issue

    def _new_comment(
        self, repository: str, number: int, body: str, user: str, **review: Any
    ) -> StoredComment:
        moment = _now()
        comment = StoredComment(
            id=self._next_id(),
            node_id="",
            repository=repository,
            number=number,
            body=body,
            user=user,
            created_at=moment,
            updated_at=moment,
            **review,
        )
        comment.node_id = _node("IC_", comment.id)
        self.comments[comment.id] = comment
        return comment

    def record(self, op: str, target: str, body: str | None) -> None:
        self.writes.append(Write(op, target, tuple(_MARKER.findall(body or ""))))

    # -- representations -----------------------------------------------------------------------

    @staticmethod
    def user_json(login: str) -> dict[str, Any]:
        """The author as GitHub shows it: a GitHub App's writes are its bot's, ``<slug>[bot]``
        of type ``Bot``."""
        return {"login": login, "id": 1, "type": "Bot" if login.endswith("[bot]") else "User"}

    @staticmethod
    def app_json(login: str) -> dict[str, Any] | None:
        """``performed_via_github_app`` of an App's bot's write (None for a user's)."""
        if not login.endswith("[bot]"):
            return None
        slug = login.removesuffix("[bot]")
        return {"id": 1, "slug": slug, "name": slug, "owner": {"login": "acme"}}

    def issue_json(self, issue: StoredIssue) -> dict[str, Any]:
        api = f"{self.api_url}/repos/{issue.repository}/issues/{issue.number}"
        data: dict[str, Any] = {
            "id": issue.id,
            "node_id": issue.node_id,
            "number": issue.number,
            "title": issue.title,
            "body": issue.body,
            "state": issue.state,
            "url": api,
            "repository_url": f"{self.api_url}/repos/{issue.repository}",
            "html_url": f"{self.base_url}/{issue.repository}/issues/{issue.number}",
            "labels": [{"id": i, "name": name} for i, name in enumerate(issue.labels, 1)],
            "user": self.user_json(issue.user),
            "performed_via_github_app": self.app_json(issue.user),
            "comments": len(self.comments_on(issue.repository, issue.number)),
            "created_at": _iso(issue.created_at),
            "updated_at": _iso(issue.updated_at),
        }
        if issue.pull:
            data["pull_request"] = {"url": api.replace("/issues/", "/pulls/")}
        return data

    def comment_json(self, comment: StoredComment) -> dict[str, Any]:
        kind = "pulls" if comment.review else "issues"
        # A review comment's page anchor is #discussion_r<id>, a conversation comment's
        # #issuecomment-<id> (on /pull/<n> for a pull request, as GitHub links them).
        page = "pull" if comment.review else "issues"
        anchor = "discussion_r" if comment.review else "issuecomment-"
        data: dict[str, Any] = {
            "id": comment.id,
            "node_id": comment.node_id,
            "body": comment.body,
            "user": self.user_json(comment.user),
            "performed_via_github_app": self.app_json(comment.user),
            "html_url": f"{self.base_url}/{comment.repository}/{page}/{comment.number}"
            f"#{anchor}{comment.id}",
            "url": f"{self.api_url}/repos/{comment.repository}/{kind}/comments/{comment.id}",
            "created_at": _iso(comment.created_at),
            "updated_at": _iso(comment.updated_at),
        }
        if comment.review:
            data.update(
                path=comment.path,
                commit_id=comment.commit_id,
                line=comment.line,
                original_line=comment.line,
                side=comment.side,
                subject_type="line",
                pull_request_review_id=1,
                pull_request_url=f"{self.api_url}/repos/{comment.repository}/pulls/"
                f"{comment.number}",
            )
        return data

    def node_json(self, issue: StoredIssue) -> dict[str, Any]:
        return {
            "id": issue.node_id,
            "number": issue.number,
            "url": f"{self.base_url}/{issue.repository}/issues/{issue.number}",
            "repository": {"nameWithOwner": issue.repository},
        }


class _Answer(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}


def _blank(title: str) -> bool:
    """A title GitHub calls blank: nothing left without whitespace and format characters
    (U+FEFF, the zero-width ones)."""
    return not "".join(c for c in title if not c.isspace() and unicodedata.category(c) != "Cf")


def _too_long(resource: str, field_name: str, code: str, maximum: int) -> dict[str, str]:
    """One error of GitHub's 422 for a value over its limit, counted in characters (code
    points, as GitHub's Ruby counts them)."""
    name = "Body" if field_name == "data" else field_name
    return {
        "resource": resource,
        "code": code,
        "field": field_name,
        "message": f"{name} is too long (maximum is {maximum} characters)",
    }


def _comment_body(resource: str, payload: Any) -> str:
    """The body of a comment's create or edit, or GitHub's 422: missing, or over 65,536."""
    body = (payload or {}).get("body") if isinstance(payload, dict) else None
    if not isinstance(body, str) or not body:
        error = {"resource": resource, "code": "missing_field", "field": "body"}
    elif len(body) > MAX_BODY:
        # An issue comment's answer names the field "data" (as GitHub's does).
        field_name = "data" if resource == "IssueComment" else "body"
        code = "unprocessable" if resource == "IssueComment" else "custom"
        error = _too_long(resource, field_name, code, MAX_BODY)
    else:
        return body
    raise _Answer(
        422, {"message": "Validation Failed", "errors": [error], "documentation_url": DOCS}
    )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _error(status: int, message: str, **extra: Any) -> _Answer:
    return _Answer(status, {"message": message, "documentation_url": DOCS, **extra})


class _Handler(BaseHTTPRequestHandler):
    tracker: GitHubTestServer
    protocol_version = "HTTP/1.1"
    server_version = "GitHub.com"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.tracker.lock:
            self.tracker._connections.add(self.connection)

    def finish(self) -> None:
        with self.tracker.lock:
            self.tracker._connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # -- dispatch ------------------------------------------------------------------------------

    def _serve(self, method: str) -> None:
        server = self.tracker
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            self._send(400, {"message": "Problems parsing JSON", "documentation_url": DOCS})
            return
        with server.lock:
            server.requests.append((method, parts.path))
            server.queries.append((method, parts.path, query))
        if self.headers.get("authorization") != f"Bearer {server.token}":
            self._send(401, {"message": "Bad credentials", "documentation_url": DOCS})
            return
        try:
            route, handler = self._route(method, parts.path, payload)
        except _Answer as answer:
            self._send(answer.status, answer.body, answer.headers)
            return
        outage = server.unreadable(method, route)
        if outage == "5xx":
            self._send(503, {"message": "Service Unavailable", "documentation_url": DOCS})
            return
        if outage == "drop":
            self._drop()
            return
        fault = server.take_fault(route)
        if fault is not None and fault.mode == "status":
            self._send(fault.status, fault.body, fault.headers)
            return
        if fault is not None and fault.mode in ("drop_before", "stall_before"):
            if fault.mode == "stall_before":
                server._release.wait(server.stall_seconds)
            self._drop()
            return
        try:
            with server.lock:
                status, body, headers = handler(query, payload)
        except _Answer as answer:
            self._send(answer.status, answer.body, answer.headers)
            return
        if fault is not None and fault.mode == "hold":
            server.held.set()
            server._release.wait(server.stall_seconds)
        if fault is not None and fault.mode in ("drop_after", "stall_after"):
            if fault.mode == "stall_after":
                server._release.wait(server.stall_seconds)
            self._drop()
            return
        self._send(status, body, headers)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        sent = {key.lower() for key in headers or {}}
        defaults = {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "4999",
            "x-ratelimit-reset": str(int(time.time()) + 3600),
            "x-ratelimit-used": "1",
            "x-ratelimit-resource": "graphql" if self.path.endswith("/graphql") else "core",
        }
        for key, value in {**defaults, **(headers or {})}.items():
            if key.lower() in sent and key not in (headers or {}):
                continue
            self.send_header(key, value)
        self.send_header("x-github-media-type", "github.v3; format=json")
        if body is not None:
            self.send_header("content-type", "application/json; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _route(self, method: str, path: str, payload: Any) -> tuple[str, Any]:
        server = self.tracker
        if path == "/api/graphql" and method == "POST":
            return self._graphql_route(payload)
        if not path.startswith("/api/v3/"):
            raise _error(404, "Not Found")
        rest = path[len("/api/v3") :]
        if rest == "/user" and method == "GET":
            return "user", lambda q, p: self._user()
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)(/.*)", rest)
        if match is None:
            raise _error(404, "Not Found")
        repository, tail = match.group(1), match.group(2)
        repo = server.repositories.get(repository)
        if repo is None or repo.gone:
            raise _error(404, "Not Found")
        routes: list[tuple[str, str, str, Any]] = [
            ("POST", r"/issues", "create_issue", self._create_issue),
            ("GET", r"/issues", "list_issues", self._list_issues),
            ("GET", r"/issues/(\d+)", "get_issue", self._get_issue),
            ("PATCH", r"/issues/(\d+)", "update_issue", self._update_issue),
            ("POST", r"/issues/(\d+)/comments", "create_comment", self._create_comment),
            ("GET", r"/issues/(\d+)/comments", "list_comments", self._list_comments),
            ("PATCH", r"/issues/comments/(\d+)", "update_comment", self._update_comment),
            ("DELETE", r"/issues/comments/(\d+)", "delete_comment", self._delete_comment),
            ("POST", r"/pulls/(\d+)/comments", "create_review_comment", self._create_review),
            ("GET", r"/pulls/(\d+)/comments", "list_review_comments", self._list_reviews),
            ("PATCH", r"/pulls/comments/(\d+)", "update_review_comment", self._update_comment),
            ("DELETE", r"/pulls/comments/(\d+)", "delete_review_comment", self._delete_comment),
        ]
        for verb, pattern, op, handler in routes:
            found = re.fullmatch(pattern, tail)
            if verb == method and found is not None:
                ids = [int(group) for group in found.groups()]
                return op, lambda q, p, h=handler, r=repository, i=ids, o=op: h(r, i, q, p, o)
        raise _error(404, "Not Found")

    # -- REST ----------------------------------------------------------------------------------

    def _user(self) -> tuple[int, Any, dict[str, str]]:
        """``GET /user``: the token's account; a GitHub App installation token (its login a
        bot's) is refused there, as GitHub refuses it."""
        login = self.tracker.login
        if login.endswith("[bot]"):
            raise _Answer(
                403,
                {
                    "message": "Resource not accessible by integration",
                    "documentation_url": f"{DOCS}/users/users#get-the-authenticated-user",
                    "status": "403",
                },
            )
        return 200, self.tracker.user_json(login), {}

    def _issue(self, repository: str, number: int) -> StoredIssue:
        server = self.tracker
        moved = server.moved.get((repository, number))
        if moved is not None:
            target = f"{server.api_url}/repos/{moved[0]}/issues/{moved[1]}"
            raise _Answer(
                301,
                {"message": "Moved Permanently", "url": target, "documentation_url": DOCS},
                {"location": target},
            )
        issue = server.issues.get((repository, number))
        if issue is None:
            raise _error(404, "Not Found")
        if issue.deleted:
            raise _error(410, "This issue was deleted")
        return issue

    @staticmethod
    def _validate(payload: Any, *, creating: bool) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise _error(400, "Problems parsing JSON")
        errors = []
        title = payload.get("title")
        if (creating or "title" in payload) and (not isinstance(title, str) or _blank(title)):
            errors.append({"resource": "Issue", "code": "missing_field", "field": "title"})
        elif isinstance(title, str) and len(title) > MAX_TITLE:
            errors.append(_too_long("Issue", "title", "custom", MAX_TITLE))
        body = payload.get("body")
        if body is not None and (not isinstance(body, str) or len(body) > MAX_BODY):
            errors.append(_too_long("Issue", "body", "custom", MAX_BODY))
        labels = payload.get("labels")
        if labels is not None and not (
            isinstance(labels, list) and all(isinstance(label, str) for label in labels)
        ):
            errors.append({"resource": "Issue", "code": "invalid", "field": "labels"})
        if errors:
            raise _Answer(
                422, {"message": "Validation Failed", "errors": errors, "documentation_url": DOCS}
            )
        return payload

    def _create_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        data = self._validate(payload, creating=True)
        issue = server._new_issue(
            repository,
            data["title"],
            data.get("body") or "",
            list(data.get("labels") or []),
            server.login,
        )
        server.record(op, f"{repository}#{issue.number}", issue.body)
        return 201, server.issue_json(issue), {"location": server.issue_json(issue)["url"]}

    def _list_issues(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        state = query.get("state", "open")
        if state not in ("open", "closed", "all"):
            raise _Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [{"resource": "Issue", "code": "invalid", "field": "state"}],
                    "documentation_url": DOCS,
                },
            )
        since = None
        if "since" in query:
            try:
                since = datetime.fromisoformat(query["since"].replace("Z", "+00:00"))
            except ValueError:
                raise _Answer(
                    422, {"message": "Validation Failed", "documentation_url": DOCS}
                ) from None
        creator = None if server.creator_ignored else query.get("creator")
        found = [
            issue
            for issue in server.issues.values()
            if issue.repository == repository
            and not issue.deleted
            and not issue.hidden
            and (state == "all" or issue.state == state)
            and (creator is None or issue.user == creator)
            and (since is None or issue.updated_at >= since)
        ]
        found.sort(key=lambda issue: issue.created_at, reverse=True)
        found.sort(key=lambda issue: issue.number, reverse=True)
        return self._page(found, query, server.issue_json, f"/repos/{repository}/issues")

    def _page(
        self, items: list[Any], query: dict[str, str], render: Any, path: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        per_page = max(1, min(100, int(query.get("per_page", 30))))
        page = max(1, int(query.get("page", 1)))
        last = max(1, -(-len(items) // per_page))
        chosen = items[(page - 1) * per_page : page * per_page]
        links = []

        def url(number: int) -> str:
            return f"{server.api_url}{path}?{urlencode({**query, 'page': number})}"

        if page < last:
            links += [f'<{url(page + 1)}>; rel="next"', f'<{url(last)}>; rel="last"']
        if page > 1:
            links += [f'<{url(1)}>; rel="first"', f'<{url(page - 1)}>; rel="prev"']
        headers = {"link": ", ".join(links)} if links else {}
        return 200, [render(item) for item in chosen], headers

    def _get_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        return 200, self.tracker.issue_json(self._issue(repository, ids[0])), {}

    def _update_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        issue = self._issue(repository, ids[0])
        data = self._validate(payload, creating=False)
        if "body" in data and data["body"] != issue.body:
            issue.edits.append(issue.body)
            issue.body = data["body"] or ""
        if "title" in data:
            issue.title = data["title"]
        if "labels" in data:
            issue.labels = list(data["labels"])
        if data.get("state") in ("open", "closed"):
            issue.state = data["state"]
        issue.updated_at = _now()
        server.record(op, f"{repository}#{issue.number}", data.get("body"))
        return 200, server.issue_json(issue), {}

    def _create_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        issue = self._issue(repository, ids[0])
        body = _comment_body("IssueComment", payload)
        comment = server._new_comment(repository, issue.number, body, server.login)
        issue.updated_at = _now()
        server.record(op, f"{repository}#{issue.number}", body)
        return 201, server.comment_json(comment), {}

    def _list_comments(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        issue = self._issue(repository, ids[0])
        found = sorted(server.comments_on(repository, issue.number), key=lambda c: c.id)
        path = f"/repos/{repository}/issues/{issue.number}/comments"
        return self._page(found, query, server.comment_json, path)

    def _comment(self, repository: str, comment_id: int, review: bool) -> StoredComment:
        comment = self.tracker.comments.get(comment_id)
        if comment is None or comment.repository != repository or comment.review != review:
            raise _error(404, "Not Found")
        return comment

    def _update_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        review = op.endswith("review_comment")
        comment = self._comment(repository, ids[0], review)
        body = _comment_body("PullRequestReviewComment" if review else "IssueComment", payload)
        comment.body = body
        comment.updated_at = _now()
        server.record(op, f"comment {comment.id}", body)
        return 200, server.comment_json(comment), {}

    def _delete_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        comment = self._comment(repository, ids[0], op.endswith("review_comment"))
        del server.comments[comment.id]
        server.record(op, f"comment {comment.id}", comment.body)
        return 204, None, {}

    def _pull(self, repository: str, number: int) -> StoredIssue:
        issue = self.tracker.issues.get((repository, number))
        if issue is None or not issue.pull:
            raise _error(404, "Not Found")
        return issue

    def _create_review(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        pull = self._pull(repository, ids[0])
        data = payload if isinstance(payload, dict) else {}
        # GitHub takes `line` and `side` (LEFT or RIGHT); the deprecated `position` (an index
        # into the diff) stands in for them when given alone.
        required = ["body", "commit_id", "path"]
        if data.get("position") is None:
            required.append("line")
        missing = [name for name in required if not data.get(name)]
        invalid = [
            name
            for name, ok in (
                ("line", data.get("line") is None or _positive(data.get("line"))),
                ("side", data.get("side", "RIGHT") in ("LEFT", "RIGHT")),
                ("position", data.get("position") is None or _positive(data.get("position"))),
            )
            if not ok
        ]
        if invalid and not missing:
            raise _Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [
                        {"resource": "PullRequestReviewComment", "code": "invalid", "field": name}
                        for name in invalid
                    ],
                    "documentation_url": DOCS,
                },
            )
        if not missing:
            _comment_body("PullRequestReviewComment", data)
        if missing:
            raise _Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "resource": "PullRequestReviewComment",
                            "code": "missing_field",
                            "field": name,
                        }
                        for name in missing
                    ],
                    "documentation_url": DOCS,
                },
            )
        comment = server._new_comment(
            repository,
            pull.number,
            data["body"],
            server.login,
            review=True,
            path=data["path"],
            commit_id=data["commit_id"],
            line=data.get("line") or data.get("position"),
            side=data.get("side", "RIGHT"),
        )
        server.record(op, f"{repository}#{pull.number}", data["body"])
        return 201, server.comment_json(comment), {}

    def _list_reviews(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        pull = self._pull(repository, ids[0])
        found = server.review_comments_on(repository, pull.number)
        return self._page(
            found, query, server.comment_json, f"/repos/{repository}/pulls/{pull.number}/comments"
        )

    # -- GraphQL -------------------------------------------------------------------------------

    def _graphql_route(self, payload: Any) -> tuple[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("query"), str):
            raise _Answer(400, {"message": "Problems parsing JSON", "documentation_url": DOCS})
        text = payload["query"]
        variables = payload.get("variables") or {}
        for name, handler in (
            ("transferIssue", self._gql_transfer),
            ("deleteIssue", self._gql_delete),
            ("node(", self._gql_node),
            ("repository(", self._gql_repository),
            ("viewer", self._gql_viewer),
        ):
            if name in text:
                op = "graphql:" + name.rstrip("(")
                return op, lambda q, p, h=handler, v=variables, o=op: h(v, o)
        raise _Answer(200, {"errors": [{"type": "INTERNAL", "message": "unsupported query"}]})

    def _by_node(self, node_id: Any) -> StoredIssue | None:
        for issue in self.tracker.issues.values():
            if issue.node_id == node_id and not issue.deleted and not issue.pull:
                return issue
        return None

    @staticmethod
    def _not_found(path: str, what: str) -> tuple[int, Any, dict[str, str]]:
        return (
            200,
            {
                "data": {path: None},
                "errors": [
                    {
                        "type": "NOT_FOUND",
                        "path": [path],
                        "locations": [{"line": 1, "column": 1}],
                        "message": what,
                    }
                ],
            },
            {},
        )

    def _gql_node(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        issue = self._by_node(variables.get("id"))
        if issue is None:
            return self._not_found(
                "node",
                f"Could not resolve to a node with the global id of '{variables.get('id')}'.",
            )
        return 200, {"data": {"node": self.tracker.node_json(issue)}}, {}

    def _gql_viewer(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        """The token's account, a user's or an App installation's bot (``<slug>[bot]``)."""
        return 200, {"data": {"viewer": {"login": self.tracker.login}}}, {}

    def _gql_repository(
        self, variables: dict[str, Any], op: str
    ) -> tuple[int, Any, dict[str, str]]:
        name = f"{variables.get('owner')}/{variables.get('name')}"
        repo = self.tracker.repositories.get(name)
        if repo is None or repo.gone:
            return self._not_found(
                "repository", f"Could not resolve to a Repository with the name '{name}'."
            )
        return 200, {"data": {"repository": {"id": repo.node_id, "nameWithOwner": name}}}, {}

    def _gql_transfer(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        issue = self._by_node(variables.get("issue"))
        target = next(
            (
                r
                for r in server.repositories.values()
                if r.node_id == variables.get("repository") and not r.gone
            ),
            None,
        )
        if issue is None or target is None:
            return self._not_found("transferIssue", "Could not resolve to a node.")
        if issue.repository == target.name:
            return (
                200,
                {
                    "data": {"transferIssue": None},
                    "errors": [
                        {
                            "type": "UNPROCESSABLE",
                            "path": ["transferIssue"],
                            "message": "The issue is already in this repository.",
                        }
                    ],
                },
                {},
            )
        old = f"{issue.repository}#{issue.number}"
        server.move_issue(issue.repository, issue.number, target.name)
        server.record(op, old, None)
        return 200, {"data": {"transferIssue": {"issue": server.node_json(issue)}}}, {}

    def _gql_delete(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        server = self.tracker
        if server.deletes_refused is not None:
            return _refused_delete(server.deletes_refused, server.login)
        issue = self._by_node(variables.get("issue"))
        if issue is None:
            return self._not_found("deleteIssue", "Could not resolve to a node.")
        issue.deleted = True
        server.record(op, f"{issue.repository}#{issue.number}", None)
        return 200, {"data": {"deleteIssue": {"clientMutationId": None}}}, {}


def _refused_delete(how: DeleteRefusal, login: str) -> tuple[int, Any, dict[str, str]]:
    """GitHub's answer to a ``deleteIssue`` it refuses (see ``refuse_deletes``)."""
    where = [{"line": 1, "column": 25}]
    if how == "not_found":
        return 404, {"message": "Not Found", "documentation_url": DOCS}, {}
    if how == "missing":
        error = {
            "path": ["mutation", "deleteIssue"],
            "extensions": {
                "code": "undefinedField",
                "typeName": "Mutation",
                "fieldName": "deleteIssue",
            },
            "locations": where,
            "message": "Field 'deleteIssue' doesn't exist on type 'Mutation'",
        }
        return 200, {"errors": [error]}, {}
    error = {
        "type": "FORBIDDEN",
        "path": ["deleteIssue"],
        "extensions": {"saml_failure": False},
        "locations": where,
        "message": f"{login} does not have the correct permissions to execute `DeleteIssue`",
    }
    return 200, {"data": {"deleteIssue": None}, "errors": [error]}, {}


def iter_markers(body: str) -> Iterator[str]:
    """The action keys whose markers ``body`` carries."""
    yield from _MARKER.findall(body)
