"""The tracker's answers as :class:`~outbox_issues.tracker.GitHubTracker` returns them: typed
pydantic models that ignore fields they do not name, and :class:`Found`, what a marker
search found and whether its listing was complete."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Model):
    login: str
    id: int | None = None
    type: str | None = None


class Label(_Model):
    name: str


class Issue(_Model):
    """An issue as ``/repos/{owner}/{repo}/issues`` returns it."""

    id: int
    node_id: str
    number: int
    title: str
    body: str | None = None
    state: str
    html_url: str
    url: str | None = None
    labels: list[Label] = []
    user: User | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    pull_request: dict[str, Any] | None = None

    @property
    def label_names(self) -> list[str]:
        return [label.name for label in self.labels]


class Comment(_Model):
    """An issue or pull-request conversation comment."""

    id: int
    node_id: str | None = None
    body: str | None = None
    html_url: str | None = None
    user: User | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ReviewComment(Comment):
    """A pull-request review comment (on a line of the diff)."""

    path: str | None = None
    commit_id: str | None = None
    line: int | None = None
    side: str | None = None
    pull_request_review_id: int | None = None


class Repository(_Model):
    name_with_owner: str
    node_id: str


class IssueNode(_Model):
    """An issue as GraphQL returns it: its node id stays the same across a transfer."""

    id: str
    number: int
    url: str
    repository: str
    """``owner/name`` of the repository that holds it now."""


@dataclass(frozen=True, slots=True)
class Found(Generic[T]):
    """What a marker search found (``item`` None: not there), and whether the listing was
    complete: every page was read. Absence proves nothing when it was not. ``foreign`` holds
    (author, ref) of each listed entry that carried a wanted marker but was not written by
    the token's identity (ref: ``#<number>`` of an issue, the id of a comment): ignored,
    never taken for ours."""

    item: T | None
    complete: bool
    pages: int
    foreign: tuple[tuple[str, str], ...] = ()


def same_login(one: str, other: str) -> bool:
    """GitHub logins are case-insensitive (the API answers with the account's own case, a
    setting may be typed otherwise)."""
    return one.casefold() == other.casefold()
