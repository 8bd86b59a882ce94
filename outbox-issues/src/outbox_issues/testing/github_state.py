"""GitHub as :class:`~outbox_issues.testing.server.GitHubTestServer` holds it: the accounts,
repositories, issues, comments and review comments, the writes it recorded (with the action
markers in their bodies), and GitHub's JSON for each. The REST routes
(:mod:`outbox_issues.testing.rest`) and GraphQL (:mod:`outbox_issues.testing.graphql`) read and
change this state under its lock; the server adds the HTTP and the faults."""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from outbox_core.testing.faults import NewWrites
from outbox_core.testing.loopback_http import Answer

DOCS = "https://docs.github.com/rest"
LOGIN = "outbox-bot"
OTHER_LOGIN = "mallory"
"""Another account: what it writes is never the token's own (plant markers with it)."""
TOKEN = "ghp_loopbacktesttoken"
PUBLIC, PRIVATE = "acme/feedback", "acme/private"
DeleteRefusal = Literal["forbidden", "missing", "not_found"]
MARKER = re.compile(r"<!-- outbox:action (\S+) -->")


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node_id(kind: str, number: int) -> str:
    return base64.b64encode(f"0:{kind}{number}".encode()).decode().rstrip("=")


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
class Repository:
    name: str
    node_id: str
    next_number: int = 1
    gone: bool = False


def error(status: int, message: str, **extra: Any) -> Answer:
    """GitHub's error answer: ``message`` and ``documentation_url``."""
    return Answer(status, {"message": message, "documentation_url": DOCS, **extra})


def iter_markers(body: str) -> Iterator[str]:
    """The action keys whose markers ``body`` carries."""
    yield from MARKER.findall(body)


class GitHubState:
    """What the loopback GitHub holds; read and change it under :attr:`lock`."""

    lock: threading.RLock

    def __init__(self, *, login: str, repositories: tuple[str, ...]) -> None:
        self.login = login
        self.repositories = {
            name: Repository(name, make_node_id("R_", index))
            for index, name in enumerate(repositories, start=1)
        }
        self.issues: dict[tuple[str, int], StoredIssue] = {}
        self.moved: dict[tuple[str, int], tuple[str, int]] = {}
        self.comments: dict[int, StoredComment] = {}
        self.writes: list[Write] = []
        self.new_issues = NewWrites()
        """Whether new issues are missing from listings (until revealed)."""
        self.creator_ignored = False
        """True while :meth:`ignore_creator_filter` lists every author's issues."""
        self.deletes_refused: DeleteRefusal | None = None
        """How :meth:`refuse_deletes` refuses every ``deleteIssue`` (None: it deletes)."""
        self._ids = 1000

    @property
    def hiding(self) -> bool:
        """True while new issues are missing from listings (:meth:`hide_new_issues`)."""
        return self.new_issues.until_revealed

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    @property
    def api_url(self) -> str:
        raise NotImplementedError

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
            issue.updated_at = now()
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
        moment = now()
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
            hidden=self.new_issues.until_revealed,
        )
        issue.node_id = make_node_id("I_", issue.id)
        self.issues[(repository, number)] = issue
        return issue

    def _new_comment(
        self, repository: str, number: int, body: str, user: str, **review: Any
    ) -> StoredComment:
        moment = now()
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
        comment.node_id = make_node_id("IC_", comment.id)
        self.comments[comment.id] = comment
        return comment

    def record(self, op: str, target: str, body: str | None) -> None:
        self.writes.append(Write(op, target, tuple(MARKER.findall(body or ""))))

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
            "created_at": iso(issue.created_at),
            "updated_at": iso(issue.updated_at),
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
            "created_at": iso(comment.created_at),
            "updated_at": iso(comment.updated_at),
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
