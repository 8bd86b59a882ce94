"""FILE_ISSUE after an unknown write: the listing by creator, every page, and its lag."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import FilingState
from outbox_issues.testing import PUBLIC, GitHubTestServer, serve_issues

from .conftest import action, filing, submit

KEY = "file_issue:r1:1"


def list_requests(server: GitHubTestServer) -> int:
    return sum(
        1
        for method, path in server.requests
        if path.endswith(f"{PUBLIC}/issues") and method == "GET"
    )


def test_an_issue_missing_from_the_listing_soon_after_the_write_is_looked_for_again_not_filed_again(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=120.0)
    tracker_server.hide_new_issues()
    tracker_server.drop("create_issue", after_recording=True)
    submit(outbox_db)

    outbox_db.drain()  # the write is accepted, its answer lost
    outbox_db.drain()  # listed completely, but sooner than two minutes after the write
    assert action(outbox_db, KEY) == (ActionState.EXECUTING, None, 2)
    assert len(tracker_server.issues_in(PUBLIC)) == 1

    tracker_server.reveal_issues()
    outbox_db.drain()
    assert action(outbox_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 3)
    assert len(tracker_server.issues_in(PUBLIC)) == 1
    assert tracker_server.writes_for(KEY) == 1


def test_an_issue_absent_from_a_complete_listing_long_after_the_write_is_written_again_once(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue")  # never recorded
    submit(issues_db)

    issues_db.drain()
    issues_db.drain()

    assert action(issues_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert tracker_server.writes_for(KEY) == 1
    assert list_requests(tracker_server) == 1


def test_a_failing_listing_rereads_and_ends_uncertain_at_the_last_attempt(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue", after_recording=True)
    submit(issues_db)
    issues_db.execute("UPDATE {schema}.agent_action SET max_attempts = 3")

    issues_db.drain()
    tracker_server.fail("list_issues", 502, "Bad Gateway")
    issues_db.drain()
    assert action(issues_db, KEY) == (ActionState.EXECUTING, None, 2)
    tracker_server.drop("list_issues")
    issues_db.drain()

    assert action(issues_db, KEY) == (ActionState.UNCERTAIN, StopReason.ATTEMPTS_EXHAUSTED, 3)
    assert filing(issues_db).state is FilingState.STOPPED
    assert tracker_server.writes_for(KEY) == 1


def test_a_rate_limited_listing_defers_without_writing(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue", after_recording=True)
    submit(issues_db)
    issues_db.drain()
    tracker_server.secondary_limit("list_issues", retry_after=3)

    issues_db.drain()
    state, _, attempts = action(issues_db, KEY)
    assert (state, attempts) == (ActionState.ADMITTED, 1)  # the deferred attempt not counted
    issues_db.drain()

    assert action(issues_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert tracker_server.writes_for(KEY) == 1


def test_the_marker_is_found_on_a_later_page_by_following_link_headers(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=0.0)
    submit(outbox_db)
    tracker_server.drop("create_issue", after_recording=True)
    outbox_db.drain()
    with tracker_server.lock:  # 250 newer issues by the same writer push it to page 3
        for number in range(250):
            tracker_server._new_issue(PUBLIC, f"other {number}", "", [], tracker_server.login)

    outbox_db.drain()

    assert action(outbox_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert tracker_server.writes_for(KEY) == 1
    assert list_requests(tracker_server) == 3


def test_the_listing_asks_for_the_writers_issues_of_every_state_since_the_write(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue", after_recording=True)
    submit(issues_db)
    issues_db.drain()
    issues_db.drain()

    [listing] = [
        query
        for method, path, query in tracker_server.queries
        if method == "GET" and path.endswith(f"{PUBLIC}/issues")
    ]
    assert listing["creator"] == tracker_server.login
    assert listing["state"] == "all"
    assert listing["per_page"] == "100"
    written = issues_db.scalar(
        "SELECT write_started_at FROM {schema}.agent_action WHERE idempotency_key = %s", (KEY,)
    )
    since = datetime.fromisoformat(listing["since"].replace("Z", "+00:00"))
    assert timedelta(minutes=4) < written - since <= timedelta(minutes=5, seconds=1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.user == tracker_server.login
    users = sum(1 for _, path in tracker_server.requests if path.endswith("/user"))
    assert users == 1


def test_an_issue_by_someone_else_with_the_marker_is_not_taken_for_the_write(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue")
    submit(issues_db)
    issues_db.drain()
    with tracker_server.lock:  # a copy of the body pasted by a person, as another user
        tracker_server._new_issue(
            PUBLIC, "copy", "<!-- outbox:action file_issue:r1:1 -->", [], "someone-else"
        )

    issues_db.drain()

    mine = [i for i in tracker_server.issues_in(PUBLIC) if i.user == tracker_server.login]
    assert len(mine) == 1
    assert filing(issues_db).issue_number == mine[0].number


@pytest.mark.parametrize("slug", ["outbox-app", None])
def test_a_github_app_token_reads_back_as_its_bot_named_by_its_slug_or_by_graphql_viewer(
    outbox_db: OutboxTestDatabase, slug: str | None
) -> None:
    with GitHubTestServer(login="outbox-app[bot]") as server:
        serve_issues(outbox_db, server, listing_lag_seconds=0.0, app_slug=slug)
        server.drop("create_issue", after_recording=True)
        submit(outbox_db)
        outbox_db.drain()
        outbox_db.drain()

        assert action(outbox_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
        assert server.writes_for(KEY) == 1
        [listing] = [q for m, path, q in server.queries if m == "GET" and path.endswith("/issues")]
        assert listing["creator"] == "outbox-app[bot]"
        asked = [path for _, path in server.requests if path.endswith(("/user", "/graphql"))]
        assert asked == ([] if slug else ["/api/v3/user", "/api/graphql"])
