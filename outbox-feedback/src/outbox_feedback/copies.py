"""The copies of a feedback on the tracker: what each should hold (its body, its marker, its
digest, its line of the diff), and the writes that bring a copy from what its row says is
there to what the feedback decided.

A copy's body carries three hidden markers (GitHub renders Markdown and drops HTML comments;
the API returns the body as written): the copy's own marker (the feedback and the item: an
attempt finds the copy by it, whichever send wrote it), the digest of the content it shows,
and the marker of the send that wrote it (``outbox_issues.markers.action_marker``). Text from a
person is made inert (``outbox_issues.markers.inert``), so it can forge no marker.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from outbox_issues import limits, markers

SUMMARY = "summary"
Surface = Literal["comment", "review_comment"]
Op = Literal["create", "update", "delete"]
_DIGEST = re.compile(r"<!-- outbox:feedback-content ([0-9a-f]{16}) -->")


class CopyState(enum.StrEnum):
    """What a copy's row knows (the table's comment in ``migrations/0001_feedback.sql``)."""

    ABSENT = "absent"
    WRITING = "writing"
    UNKNOWN = "unknown"
    PRESENT = "present"

    @property
    def may_exist_unconfirmed(self) -> bool:
        """A write may have reached the tracker and nobody has read it back yet."""
        return self in (CopyState.WRITING, CopyState.UNKNOWN)


def copy_marker(feedback_id: str, item_id: str) -> str:
    """The marker of one copy: the feedback and the item, whichever send wrote it."""
    feedback, item = markers.inert_key(feedback_id), markers.inert_key(item_id)
    return f"<!-- outbox:feedback-copy {feedback} {item} -->"


def digest_in(body: str | None) -> str | None:
    """The content digest a copy's body carries (None: not one of ours, or no digest)."""
    found = _DIGEST.search(body or "")
    return found.group(1) if found else None


@dataclass(frozen=True, slots=True)
class Item:
    """A decided inline item, on one line of the diff."""

    item_id: str
    path: str
    commit_id: str
    line: int
    side: Literal["LEFT", "RIGHT"]
    body: str
    resolved: bool = False

    @property
    def position(self) -> str:
        return position_of(self.path, self.commit_id, self.line, self.side)


def position_of(path: str | None, commit_id: str | None, line: int | None, side: str | None) -> str:
    """One text for where a review comment stands (compared to tell that an item moved)."""
    return f"{commit_id}:{side}:{line}:{path}"


@dataclass(frozen=True, slots=True)
class Wanted:
    """What one copy should hold on the tracker."""

    item_id: str
    surface: Surface
    marker: str
    visible: str
    digest: str
    item: Item | None = None
    """The inline item (None for the summary)."""

    @property
    def position(self) -> str | None:
        return self.item.position if self.item is not None else None

    def body(self, action_key: str) -> str:
        return (
            f"{self.visible}\n\n{self.marker}\n"
            f"<!-- outbox:feedback-content {self.digest} -->\n"
            f"{markers.action_marker(action_key)}\n"
        )


def check_copies(
    feedback_id: str, summary: str | None, items: Sequence[Item], action_key: str
) -> None:
    """Refuse (:class:`~outbox_core.InvalidRequest`) a copy GitHub would not take whole: each
    comment's body as the send of ``action_key`` writes it (the text made inert, its markers,
    ``**Resolved.**`` when marked) over 65,536 characters (:mod:`outbox_issues.limits`)."""
    if summary is not None:
        body = summary_copy(feedback_id, summary).body(action_key)
        limits.check_body("summary", body, "the summary comment")
    for index, item in enumerate(items):
        body = item_copy(feedback_id, item).body(action_key)
        limits.check_body(f"items[{index}].body", body, f"the review comment of {item.item_id!r}")


def summary_copy(feedback_id: str, summary: str) -> Wanted:
    visible = markers.inert(summary)
    marker = copy_marker(feedback_id, SUMMARY)
    return Wanted(SUMMARY, "comment", marker, visible, markers.digest("", visible, []))


def item_copy(feedback_id: str, item: Item) -> Wanted:
    text = markers.inert(item.body)
    visible = f"**Resolved.** {text}" if item.resolved else text
    marker = copy_marker(feedback_id, item.item_id)
    return Wanted(
        item.item_id,
        "review_comment",
        marker,
        visible,
        markers.digest("", visible, [item.position]),
        item,
    )


@dataclass(frozen=True, slots=True)
class CopyRow:
    """One row of ``feedback_copy`` as an attempt read it."""

    item_id: str
    surface: Surface
    marker: str
    state: CopyState
    provider_id: int | None
    url: str | None
    confirmed_digest: str | None
    confirmed_position: str | None
    write_op: Op | None
    write_digest: str | None
    write_action: int | None
    write_started_at: datetime | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> CopyRow:
        values = list(row)
        values[3] = CopyState(values[3])
        return cls(*values)


def writes_for(wanted: Wanted | None, row: CopyRow | None) -> list[Op]:
    """The writes that bring a settled copy (present or absent) to ``wanted`` (None: the
    copy should not exist). GitHub edits only a review comment's body, so an item that moved
    to another line is deleted and created again."""
    present = row is not None and row.state is CopyState.PRESENT
    if wanted is None:
        return ["delete"] if present else []
    if not present:
        return ["create"]
    assert row is not None
    if wanted.surface == "review_comment" and row.confirmed_position != wanted.position:
        return ["delete", "create"]
    if row.confirmed_digest != wanted.digest:
        return ["update"]
    return []
