"""Finding actions (outbox_core.search): each filter finds what it names and nothing else,
pages go newest first through every match with the cursor, a cursor is bound to its filter,
a page reads a bounded window, and wrong input is refused naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from outbox_core import ActionFilter, ActionRequest, InvalidFilter, afind_actions, find_actions
from outbox_core import search as search_module
from outbox_core.search import Page, encode_cursor
from outbox_core.testing import OutboxTestDatabase

# (kind, lane, key, workspace, subject); odd ones are cancelled afterwards.
ROWS = [
    ("TEST_NOOP", "lane-a", "report:1:1", None, "acct-1"),
    ("TEST_NOOP", "lane-a", "report:1:2", None, None),
    ("TEST_PAINT", "lane-b", "report:2:1", "ws-1", "acct-1"),
    ("TEST_PAINT", "lane-b", "paint:1", "ws-2", None),
    ("TEST_NOOP", "lane-c", "report:10:1", None, "acct-2"),
    ("TEST_PAINT", "lane-c", "paint:2", "ws-1", None),
]


def _enqueue(db: OutboxTestDatabase) -> list[int]:
    ids: list[int] = []
    with db.connect() as conn:
        for kind, lane, key, workspace, subject in ROWS:
            payload: dict[str, Any] = {"color": "red"} if kind == "TEST_PAINT" else {}
            ids.append(
                db.outbox.enqueue(
                    conn,
                    ActionRequest(
                        kind,
                        lane,
                        key,
                        payload,
                        workspace_id=workspace,
                        subject_account_id=subject,
                    ),
                ).id
            )
        for index in range(1, len(ids), 2):
            assert db.outbox.cancel(conn, ids[index]) is not None
        conn.commit()
    return ids


def _found(db: OutboxTestDatabase, action_filter: ActionFilter, **kwargs: Any) -> list[int]:
    with db.connect() as conn:
        return [a.id for a in find_actions(conn, db.outbox, action_filter, **kwargs).actions]


def _every_page(db: OutboxTestDatabase, action_filter: ActionFilter, limit: int = 50) -> list[Page]:
    """Every page of a search, following the cursor (at most ten pages)."""
    pages: list[Page] = []
    cursor = None
    with db.connect() as conn:
        while len(pages) < 10:
            pages.append(find_actions(conn, db.outbox, action_filter, limit=limit, cursor=cursor))
            cursor = pages[-1].next_cursor
            if cursor is None:
                break
    return pages


def _expected(ids: list[int], *indexes: int) -> list[int]:
    return sorted((ids[i] for i in indexes), reverse=True)


@pytest.mark.parametrize(
    ("action_filter", "indexes"),
    [
        (ActionFilter(), (0, 1, 2, 3, 4, 5)),
        (ActionFilter(kind="TEST_PAINT"), (2, 3, 5)),
        (ActionFilter(states=["CANCELLED"]), (1, 3, 5)),
        (ActionFilter(states=["admitted", "CANCELLED"]), (0, 1, 2, 3, 4, 5)),
        (ActionFilter(stop_reason="OPERATOR_CANCELLED"), (1, 3, 5)),
        (ActionFilter(lane_key="lane-b"), (2, 3)),
        (ActionFilter(key="report:1:2"), (1,)),
        (ActionFilter(key_prefix="report:1:"), (0, 1)),
        (ActionFilter(key_prefix="report:1"), (0, 1, 4)),
        (ActionFilter(subject="acct-1"), (0, 2)),
        (ActionFilter(workspace="ws-1"), (2, 5)),
        (ActionFilter(kind="TEST_NOOP", states=["ADMITTED"]), (0, 4)),
        (ActionFilter(lane_key="lane-c", kind="TEST_PAINT"), (5,)),
        (ActionFilter(key_prefix="paint:", workspace="ws-2"), (3,)),
        (ActionFilter(kind="TEST_ONCE"), ()),
    ],
)
def test_each_filter_finds_exactly_the_actions_it_names_newest_first(
    db: OutboxTestDatabase, action_filter: ActionFilter, indexes: tuple[int, ...]
) -> None:
    ids = _enqueue(db)
    assert _found(db, action_filter) == _expected(ids, *indexes)


def test_the_time_range_filters_by_creation_and_by_ending(db: OutboxTestDatabase) -> None:
    ids = _enqueue(db)
    # Two admitted actions made two days ago (an ended one never changes).
    db.execute(
        "UPDATE {schema}.agent_action SET created_at = created_at - interval '2 days' "
        "WHERE id = ANY(%s)",
        [[ids[0], ids[2]]],
    )
    now = datetime.now(UTC)
    day_ago = now - timedelta(days=1)
    assert _found(db, ActionFilter(created_until=day_ago)) == _expected(ids, 0, 2)
    assert _found(db, ActionFilter(created_since=day_ago)) == _expected(ids, 1, 3, 4, 5)
    ended = ActionFilter(ended_since=day_ago, ended_until=now + timedelta(hours=1))
    assert _found(db, ended) == _expected(ids, 1, 3, 5)
    assert _found(db, ActionFilter(ended_until=day_ago)) == []


def test_paging_with_the_cursor_reaches_every_match_once_and_then_ends(
    db: OutboxTestDatabase,
) -> None:
    ids = _enqueue(db)
    pages = _every_page(db, ActionFilter(key_prefix="report:"), limit=1)
    assert [a.id for page in pages for a in page.actions] == _expected(ids, 0, 1, 2, 4)
    assert [len(page.actions) for page in pages] == [1, 1, 1, 1]


def test_a_page_reads_at_most_its_window_and_says_more_may_match(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _enqueue(db)
    monkeypatch.setattr(search_module, "CANDIDATE_WINDOW", 4)
    admitted = ActionFilter(states=["ADMITTED"])
    with db.connect() as conn:
        # The newest four actions are the first window: two of them match, the page is short.
        first = find_actions(conn, db.outbox, admitted, limit=5)
        assert [a.id for a in first.actions] == _expected(ids, 4, 2)
        assert first.more_may_match and first.note is not None
        assert "narrow the filter" in first.note
        second = find_actions(conn, db.outbox, admitted, limit=5, cursor=first.next_cursor)
        assert [a.id for a in second.actions] == [ids[0]]
        # The second window held fewer rows than a window: the walk ended there.
        assert second.next_cursor is None and not second.more_may_match


def test_a_key_prefix_that_matches_more_than_the_window_is_filtered_in_bounded_windows(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _enqueue(db)
    monkeypatch.setattr(search_module, "CANDIDATE_WINDOW", 3)
    pages = _every_page(db, ActionFilter(key_prefix="report:"))
    # Four keys match, more than the window: the primary key's walk, three rows a page.
    assert [a.id for a in pages[0].actions] == [ids[4]] and pages[0].more_may_match
    assert [a.id for page in pages for a in page.actions] == _expected(ids, 0, 1, 2, 4)


def test_a_cursor_made_under_one_filter_is_refused_under_another(
    db: OutboxTestDatabase,
) -> None:
    _enqueue(db)
    with db.connect() as conn:
        page = find_actions(conn, db.outbox, ActionFilter(kind="TEST_NOOP"), limit=1)
        assert page.next_cursor is not None
        with pytest.raises(InvalidFilter, match="another filter") as refused:
            find_actions(conn, db.outbox, ActionFilter(kind="TEST_PAINT"), cursor=page.next_cursor)
    assert refused.value.field == "cursor"


@pytest.mark.parametrize("cursor", ["", "not-a-cursor", encode_cursor(0, "x"), "W10"])
def test_a_cursor_that_no_search_gave_is_refused(db: OutboxTestDatabase, cursor: str) -> None:
    with db.connect() as conn, pytest.raises(InvalidFilter, match="^cursor: "):
        find_actions(conn, db.outbox, ActionFilter(), cursor=cursor)


@pytest.mark.parametrize("limit", [0, -1, 501, True])
def test_a_page_size_outside_1_to_500_is_refused(db: OutboxTestDatabase, limit: int) -> None:
    with db.connect() as conn, pytest.raises(InvalidFilter, match="^limit: "):
        find_actions(conn, db.outbox, ActionFilter(), limit=limit)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": "email"}, "kind"),
        ({"kind": ""}, "kind"),
        ({"lane_key": ""}, "lane_key"),
        ({"subject": "a\x00b"}, "subject"),
        ({"workspace": 3}, "workspace"),
        ({"states": ["DONEE"]}, "states"),
        ({"stop_reason": "not a reason"}, "stop_reason"),
        ({"key": "a", "key_prefix": "a"}, "key_prefix"),
        ({"created_since": datetime(2026, 1, 1)}, "created_since"),
        (
            {
                "ended_since": datetime(2026, 1, 2, tzinfo=UTC),
                "ended_until": datetime(2026, 1, 1, tzinfo=UTC),
            },
            "ended_until",
        ),
    ],
)
def test_a_wrong_filter_field_is_refused_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidFilter) as refused:
        ActionFilter(**fields)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    assert "\n" not in str(refused.value)


def test_a_filter_fingerprint_ignores_the_order_of_states() -> None:
    one = ActionFilter(states=["DONE", "FAILED"])
    two = ActionFilter(states=["FAILED", "DONE", "FAILED"])
    assert one.fingerprint() == two.fingerprint() != ActionFilter(states=["DONE"]).fingerprint()


async def test_the_async_twin_finds_what_the_sync_form_finds(db: OutboxTestDatabase) -> None:
    ids = _enqueue(db)
    conn = await db.aconnect()
    async with conn:
        page = await afind_actions(conn, db.outbox, ActionFilter(lane_key="lane-a"))
    assert isinstance(page, Page)
    assert [a.id for a in page.actions] == _expected(ids, 0, 1)
    assert page.as_dict()["actions"][0]["id"] == ids[1]
    assert "payload" not in page.as_dict()["actions"][0]
