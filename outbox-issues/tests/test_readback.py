"""FILE_ISSUE after an unknown write: the listing by creator, every page, and its lag."""

from __future__ import annotations

import asyncio
import time
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
    assert action(outbox_db, KEY) == (ActionState.EXECUTING, None, 1)  # a read counts none
    assert len(tracker_server.issues_in(PUBLIC)) == 1
    detail = outbox_db.scalar("SELECT last_detail FROM {schema}.agent_action")
    assert detail.startswith("listing lag: a write this recent may not be listed yet")

    tracker_server.reveal_issues()
    outbox_db.drain()
    assert action(outbox_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
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


def test_a_failing_listing_rereads_without_spending_an_attempt_and_says_what_it_saw(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue", after_recording=True)
    submit(issues_db)
    issues_db.execute("UPDATE {schema}.agent_action SET max_attempts = 2")

    issues_db.drain()
    for fail, seen in (
        (lambda: tracker_server.fail("list_issues", 502, "Bad Gateway"), "HTTP 502 Bad Gateway"),
        (lambda: tracker_server.drop("list_issues"), "RemoteProtocolError after the request"),
        (lambda: tracker_server.fail("list_issues", 500), "HTTP 500 Server Error"),
    ):
        fail()
        issues_db.drain()
        assert action(issues_db, KEY) == (ActionState.EXECUTING, None, 1)
        detail = issues_db.scalar("SELECT last_detail FROM {schema}.agent_action")
        assert detail.startswith(seen), detail
    issues_db.drain()

    assert action(issues_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert filing(issues_db).state is FilingState.FILED
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


def issue_kinds(db: OutboxTestDatabase, server: GitHubTestServer, **values: object) -> None:
    """The four kinds served by ``server``, with read-back settings of this test's own."""
    for adapter in serve_issues(db, server, listing_lag_seconds=0.0):
        for name, value in values.items():
            setattr(adapter, name, value)


async def test_a_listing_outage_longer_than_a_minute_spends_no_attempt_and_ends_with_one_issue(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    """The write's answer is lost, then every read fails (503) for 65 s: a running executor
    reads again and again (waits capped at 3 s here, so many more reads than the action's two
    attempts), none of those reads counts, and the first read after the outage finds the
    issue."""
    issue_kinds(outbox_db, tracker_server, reread_cap=timedelta(seconds=3))
    tracker_server.drop("create_issue", after_recording=True)
    submit(outbox_db)
    outbox_db.execute("UPDATE {schema}.agent_action SET max_attempts = 2")
    await outbox_db.adrain()  # the issue is written, its answer lost: Reread, attempt 1
    assert action(outbox_db, KEY) == (ActionState.EXECUTING, None, 1)
    tracker_server.make_unreadable(65.0)
    reads_before = len(tracker_server.requests)

    stop = asyncio.Event()
    executor = outbox_db.executor(poll_seconds=0.2)
    runner = asyncio.create_task(executor.run(stop))
    try:
        deadline = time.monotonic() + 300
        while action(outbox_db, KEY)[0] is ActionState.EXECUTING:
            assert time.monotonic() < deadline, "the read-back never ended"
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await runner
        await executor.close()

    # The write's attempt and the read that found it: the reads in between counted none.
    assert action(outbox_db, KEY) == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert len(tracker_server.issues_in(PUBLIC)) == 1
    assert tracker_server.writes_for(KEY) == 1
    # GET /user (the executor's own client asks once) and the listings, failing for 65 s.
    reads = [method for method, _ in tracker_server.requests[reads_before:]]
    assert reads.count("GET") > 4 and "POST" not in reads  # many reads, no second write


def test_a_listing_that_stays_unreadable_past_unreadable_for_ends_readback_unavailable(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    issue_kinds(outbox_db, tracker_server, unreadable_for=timedelta(seconds=2))
    tracker_server.drop("create_issue", after_recording=True)
    submit(outbox_db)
    outbox_db.drain()  # the issue is written, its answer lost
    tracker_server.make_unreadable()
    deadline = time.monotonic() + 60
    while action(outbox_db, KEY)[0] is ActionState.EXECUTING:  # a read each drain
        assert time.monotonic() < deadline, "the read-back was never given up"
        outbox_db.drain()

    assert action(outbox_db, KEY) == (ActionState.UNCERTAIN, StopReason.READBACK_UNAVAILABLE, 2)
    detail = outbox_db.scalar("SELECT last_detail FROM {schema}.agent_action")
    assert detail == "HTTP 503 Service Unavailable"
    assert filing(outbox_db).state is FilingState.STOPPED
    assert tracker_server.writes_for(KEY) == 1
