"""Bad input is refused before anything is written, with an error naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from outbox_core import InvalidRequest
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import (
    FeedbackRetracted,
    FeedbackSendQueue,
    Item,
    create_feedback,
    decide,
    mark,
    retract,
)
from outbox_feedback.copies import summary_copy
from outbox_feedback.domain import send_key

from .conftest import AUTHOR, COMMIT, ITEMS, store

GOOD: dict[str, Any] = {
    "workspace_id": "ws-1",
    "author_account_id": AUTHOR,
    "repository": "acme/feedback",
    "pull_number": 1,
    "summary": "Fine.",
}
LONGEST = 65_536 - len(summary_copy("fb-1", "").body(send_key("fb-1", 2**31 - 1)))
TOO_LONG = [
    # Each comment's body as a send writes it must fit GitHub's 65,536 characters: the text
    # made inert (each "<!--" a person writes grows by three) and the copy's markers counted.
    ("summary", {"summary": "s" * (LONGEST + 1)}),
    ("summary", {"summary": "<!--" * (LONGEST // 4)}),
    # "**Resolved.** " is counted: a mark adds it later, without a check of its own.
    ("items[0].body", {"items": [Item("i1", "a.py", COMMIT, 1, "RIGHT", "b" * LONGEST)]}),
    ("summary", {"summary": "\u200b\ufeff"}),  # nothing a reader could see
    ("items[0].body", {"items": [Item("i1", "a.py", COMMIT, 1, "RIGHT", "\u2060")]}),
]
BAD = [
    ("feedback_id", {"feedback_id": "fb 1"}),
    ("repository", {"repository": "acme"}),
    ("pull_number", {"pull_number": 0}),
    ("summary", {"summary": "  "}),
    ("items[0].side", {"items": [Item("i1", "a.py", COMMIT, 1, "UP", "x")]}),  # type: ignore[arg-type]
    ("items[0].line", {"items": [Item("i1", "a.py", COMMIT, 0, "RIGHT", "x")]}),
    ("items[0].item_id", {"items": [Item("summary", "a.py", COMMIT, 1, "RIGHT", "x")]}),
    ("items[1].item_id", {"items": [ITEMS[0], ITEMS[0]]}),
    ("items[0].commit_id", {"items": [Item("i1", "a.py", "", 1, "RIGHT", "x")]}),
    *TOO_LONG,
]


@pytest.mark.parametrize(("field", "change"), BAD, ids=range(len(BAD)))
def test_create_feedback_refuses_bad_input_naming_the_field_and_writes_nothing(
    outbox_db: OutboxTestDatabase, field: str, change: dict[str, Any]
) -> None:
    values = {"feedback_id": "fb-1", **GOOD, **change}
    with outbox_db.connect() as conn, pytest.raises(InvalidRequest) as refused:
        create_feedback(conn, outbox=outbox_db.outbox, **values)
    assert refused.value.field == field
    assert "\n" not in str(refused.value)
    assert outbox_db.scalar("SELECT count(*) FROM {schema}.feedback") == 0


def test_a_retracted_feedback_takes_no_decision_or_mark(
    feedback_db: OutboxTestDatabase, pull: int
) -> None:
    store(feedback_db, pull)
    with feedback_db.connect() as conn:
        retract(conn, "fb-1", outbox=feedback_db.outbox)
        with pytest.raises(FeedbackRetracted):
            decide(conn, "fb-1", outbox=feedback_db.outbox, summary="Again.")
        with pytest.raises(FeedbackRetracted):
            mark(conn, "fb-1", "i1", outbox=feedback_db.outbox)


def test_marking_an_unknown_item_is_refused(feedback_db: OutboxTestDatabase, pull: int) -> None:
    store(feedback_db, pull)
    with feedback_db.connect() as conn, pytest.raises(InvalidRequest, match="no item 'i9'"):
        mark(conn, "fb-1", "i9", outbox=feedback_db.outbox)


@pytest.mark.parametrize(("field", "change"), TOO_LONG, ids=range(len(TOO_LONG)))
def test_a_decision_whose_copy_github_would_not_take_whole_is_refused_and_writes_nothing(
    outbox_db: OutboxTestDatabase, field: str, change: dict[str, Any]
) -> None:
    with outbox_db.connect() as conn:
        create_feedback(conn, "fb-1", outbox=outbox_db.outbox, **GOOD)
        with pytest.raises(InvalidRequest) as refused:
            decide(conn, "fb-1", outbox=outbox_db.outbox, **change)
        conn.commit()
    assert refused.value.field == field
    assert outbox_db.scalar("SELECT revision FROM {schema}.feedback") == 1


def test_the_longest_summary_that_fits_is_accepted(outbox_db: OutboxTestDatabase) -> None:
    with outbox_db.connect() as conn:
        assert create_feedback(
            conn, "fb-1", outbox=outbox_db.outbox, **{**GOOD, "summary": "s" * LONGEST}
        )


def test_a_send_whose_stored_copy_github_would_not_take_whole_is_refused_by_its_enqueue_check(
    feedback_db: OutboxTestDatabase, pull: int
) -> None:
    """The kind's own check reads the feedback the send will carry (as the caller's transaction
    holds it) and measures each copy with the send's own key: a summary stored past the limit
    (by a build before this check) is refused on every enqueue path, nothing written."""
    from outbox_core import ActionRequest

    with feedback_db.connect() as conn:
        create_feedback(conn, "fb-1", outbox=feedback_db.outbox, **{**GOOD, "pull_number": pull})
        conn.execute(
            "UPDATE " + f'"{feedback_db.schema}"' + ".feedback SET summary = repeat('s', 70000)"
        )
        with pytest.raises(InvalidRequest) as refused:
            FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
        assert refused.value.field == "summary" and "65,536" in str(refused.value)
        request = ActionRequest(
            kind="DELIVER_FEEDBACK",
            lane_key="feedback:fb-1",
            idempotency_key=send_key("fb-1", 1),
            payload={"feedback": "fb-1"},
            workspace_id="ws-1",
        )
        with pytest.raises(InvalidRequest, match="summary"):
            feedback_db.outbox.enqueue(conn, request)
        conn.commit()
    assert feedback_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0
