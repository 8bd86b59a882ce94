"""The tracker client against the loopback tracker: the surface outbox-feedback will use
(comments and review comments with markers), pagination, typed failures, GraphQL's errors."""

from __future__ import annotations

import pytest

from outbox_issues import markers
from outbox_issues.settings import IssuesSettings, graphql_url_for
from outbox_issues.testing import PRIVATE, PUBLIC, TOKEN, GitHubTestServer
from outbox_issues.tracker import (
    GitHubTracker,
    GraphQLRefused,
    NotSent,
    RateLimited,
    Refused,
    Unanswered,
)


def client(server: GitHubTestServer, **options: object) -> GitHubTracker:
    return GitHubTracker(server.api_url, TOKEN, timeout=1.0, connect_timeout=1.0, **options)  # type: ignore[arg-type]


async def test_issue_comments_are_created_edited_listed_found_by_marker_and_deleted(
    tracker_server: GitHubTestServer,
) -> None:
    async with client(tracker_server) as tracker:
        issue = await tracker.create_issue(PUBLIC, title="t", body="b", labels=["bug"])
        assert issue.label_names == ["bug"] and issue.number == 1
        marker = markers.action_marker("feedback:7:1:deliver")
        for n in range(120):
            await tracker.create_comment(PUBLIC, issue.number, f"comment {n}")
        made = await tracker.create_comment(PUBLIC, issue.number, f"{marker}\nhello")
        edited = await tracker.update_comment(PUBLIC, made.id, f"{marker}\nhello again")
        assert edited.body is not None and edited.body.endswith("hello again")

        listed = await tracker.list_comments(PUBLIC, issue.number, per_page=50)
        found = await tracker.find_comment(PUBLIC, issue.number, marker, per_page=50)
        assert len(listed) == 121
        assert found.item is not None and found.item.id == made.id and found.pages == 3

        await tracker.delete_comment(PUBLIC, made.id)
        gone = await tracker.find_comment(PUBLIC, issue.number, marker)
        assert gone.item is None and gone.complete
        with pytest.raises(Refused) as refused:
            await tracker.delete_comment(PUBLIC, made.id)
        assert refused.value.status == 404


async def test_review_comments_on_a_pull_request_are_created_edited_listed_and_deleted(
    tracker_server: GitHubTestServer,
) -> None:
    pull = tracker_server.add_pull_request(PUBLIC)
    async with client(tracker_server) as tracker:
        marker = markers.action_marker("feedback:8:1:deliver")
        made = await tracker.create_review_comment(
            PUBLIC, pull, f"{marker}\nnit", commit_id="abc123", path="src/app.py", line=3
        )
        assert (made.path, made.line, made.side) == ("src/app.py", 3, "RIGHT")
        await tracker.update_review_comment(PUBLIC, made.id, f"{marker}\nnit, fixed")
        found = await tracker.find_review_comment(PUBLIC, pull, marker)
        assert found.item is not None and found.item.body == f"{marker}\nnit, fixed"
        assert [c.id for c in await tracker.list_review_comments(PUBLIC, pull)] == [made.id]
        await tracker.delete_review_comment(PUBLIC, made.id)
        assert await tracker.list_review_comments(PUBLIC, pull) == []
        with pytest.raises(Refused, match="422"):
            await tracker.create_review_comment(PUBLIC, pull, "x", commit_id="", path="a", line=1)


async def test_several_markers_are_found_in_one_listing_of_each_kind_of_comment(
    tracker_server: GitHubTestServer,
) -> None:
    pull = tracker_server.add_pull_request(PUBLIC)
    first, second, missing = (markers.action_marker(f"feedback:9:{n}:review") for n in (1, 2, 3))
    async with client(tracker_server) as tracker:
        for n in range(60):
            await tracker.create_comment(PUBLIC, pull, f"comment {n}")
        one = await tracker.create_comment(PUBLIC, pull, f"{first}\nsummary")
        two = await tracker.create_review_comment(
            PUBLIC, pull, f"{second}\nnit", commit_id="abc", path="a.py", line=2, side="LEFT"
        )
        await tracker.identity()  # asked once, before the first listing
        before = len(tracker_server.requests)
        found = await tracker.find_comments(PUBLIC, pull, [first, missing], per_page=25)
        assert found.complete and found.pages == 3 and len(tracker_server.requests) == before + 3
        assert found.item is not None and found.item[first].id == one.id
        assert missing not in found.item
        cut = await tracker.find_comments(PUBLIC, pull, [missing], per_page=25, max_pages=2)
        assert not cut.complete and cut.item == {}
        reviews = await tracker.find_review_comments(PUBLIC, pull, [second])
        assert reviews.complete and reviews.item is not None
        assert (reviews.item[second].id, reviews.item[second].side) == (two.id, "LEFT")
        assert reviews.item[second].html_url is not None
        assert reviews.item[second].html_url.endswith(f"/pull/{pull}#discussion_r{two.id}")


async def test_a_review_comment_takes_line_and_side_and_the_deprecated_position_alone(
    tracker_server: GitHubTestServer,
) -> None:
    pull = tracker_server.add_pull_request(PUBLIC)
    async with client(tracker_server) as tracker:
        with pytest.raises(Refused) as refused:
            await tracker.create_review_comment(
                PUBLIC,
                pull,
                "x",
                commit_id="abc",
                path="a.py",
                line=2,
                side="UP",  # type: ignore[arg-type]
            )
        assert refused.value.status == 422
        assert refused.value.errors[0]["field"] == "side"
        made = await tracker.request(
            "POST",
            f"/repos/{PUBLIC}/pulls/{pull}/comments",
            json={"body": "old style", "commit_id": "abc", "path": "a.py", "position": 4},
        )
        assert made.json()["line"] == 4
        edited = await tracker.update_review_comment(PUBLIC, made.json()["id"], "new body")
        assert (edited.body, edited.line, edited.path) == ("new body", 4, "a.py")


async def test_a_listing_cut_short_by_max_pages_is_not_complete(
    tracker_server: GitHubTestServer,
) -> None:
    async with client(tracker_server) as tracker:
        for n in range(5):
            await tracker.create_issue(PUBLIC, title=f"t{n}", body="b")
        found = await tracker.find_issue(PUBLIC, "absent", since=None, per_page=2, max_pages=2)
        assert (found.item, found.complete, found.pages) == (None, False, 2)
        whole = await tracker.find_issue(PUBLIC, "absent", since=None, per_page=2)
        assert (whole.complete, whole.pages) == (True, 3)
        assert len(await tracker.list_issues(PUBLIC, per_page=2)) == 5
        assert await tracker.list_issues(PUBLIC, creator="nobody") == []


async def test_failures_are_typed_by_what_they_prove(tracker_server: GitHubTestServer) -> None:
    async with client(tracker_server) as tracker:
        tracker_server.primary_limit("create_issue", reset_in=90)
        with pytest.raises(RateLimited) as primary:
            await tracker.create_issue(PUBLIC, title="t", body="b")
        assert not primary.value.secondary and 80 < primary.value.wait_seconds < 100

        tracker_server.secondary_limit("create_issue", retry_after=7, status=429)
        with pytest.raises(RateLimited) as secondary:
            await tracker.create_issue(PUBLIC, title="t", body="b")
        assert secondary.value.secondary and secondary.value.wait_seconds == 7

        tracker_server.validation_failed("create_issue")
        with pytest.raises(Refused) as invalid:
            await tracker.create_issue(PUBLIC, title="t", body="b")
        assert invalid.value.status == 422 and invalid.value.errors[0]["field"] == "title"

        tracker_server.fail("create_issue", 503, "Service Unavailable")
        with pytest.raises(Unanswered):
            await tracker.create_issue(PUBLIC, title="t", body="b")
        tracker_server.drop("create_issue", after_recording=True)
        with pytest.raises(Unanswered):
            await tracker.create_issue(PUBLIC, title="t", body="b")
        assert len(tracker_server.issues_in(PUBLIC)) == 1  # the dropped one exists

    async with GitHubTracker(tracker_server.api_url, "wrong") as bad:
        with pytest.raises(Refused, match="Bad credentials"):
            await bad.identity()


async def test_a_refused_connection_is_not_sent_and_is_never_retried_by_the_client() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    async with GitHubTracker(f"http://127.0.0.1:{closed}/api/v3", TOKEN) as tracker:
        with pytest.raises(NotSent):
            await tracker.create_issue(PUBLIC, title="t", body="b")


async def test_a_transferred_issues_rest_url_answers_301_and_is_not_followed(
    tracker_server: GitHubTestServer,
) -> None:
    async with client(tracker_server) as tracker:
        issue = await tracker.create_issue(PUBLIC, title="t", body="b")
        target = await tracker.repository(PRIVATE)
        moved = await tracker.transfer_issue(issue.node_id, target.node_id)
        assert moved.repository == PRIVATE and moved.id == issue.node_id
        with pytest.raises(Refused) as redirected:
            await tracker.get_issue(PUBLIC, issue.number, follow_moved=False)
        assert redirected.value.status == 301
        assert redirected.value.location is not None and PRIVATE in redirected.value.location
        node = await tracker.issue_by_node(issue.node_id)
        assert node is not None and node.repository == PRIVATE
        followed = await tracker.get_issue(PUBLIC, issue.number)  # a read follows it once
        assert followed.node_id == issue.node_id and f"/{PRIVATE}/" in followed.html_url
        with pytest.raises(Refused, match="301"):
            await tracker.update_issue(PUBLIC, issue.number, title="x")  # a write never
        followed = await tracker.get_issue(PUBLIC, issue.number)  # a read follows it once
        assert followed.node_id == issue.node_id and f"/{PRIVATE}/" in followed.html_url
        with pytest.raises(Refused, match="301"):
            await tracker.update_issue(PUBLIC, issue.number, title="x")  # a write never


async def test_graphql_errors_at_http_200_are_failures_by_type_never_data(
    tracker_server: GitHubTestServer,
) -> None:
    async with client(tracker_server) as tracker:
        issue = await tracker.create_issue(PUBLIC, title="t", body="b")
        tracker_server.graphql_error("graphql:deleteIssue", "FORBIDDEN")
        with pytest.raises(GraphQLRefused) as forbidden:
            await tracker.delete_issue(issue.node_id)
        assert forbidden.value.types == ["FORBIDDEN"]
        tracker_server.graphql_error("graphql:deleteIssue", "RATE_LIMITED")
        with pytest.raises(RateLimited):
            await tracker.delete_issue(issue.node_id)
        await tracker.delete_issue(issue.node_id)
        assert await tracker.issue_by_node(issue.node_id) is None
        with pytest.raises(Refused) as gone:
            await tracker.get_issue(PUBLIC, issue.number)
        assert gone.value.status == 410
        with pytest.raises(GraphQLRefused) as missing:
            await tracker.repository("acme/nothing")
        assert missing.value.types == ["NOT_FOUND"]


@pytest.mark.parametrize(
    ("api", "graphql"),
    [
        ("https://api.github.com", "https://api.github.com/graphql"),
        ("https://github.example.com/api/v3", "https://github.example.com/api/graphql"),
        ("https://github.example.com/api/v3/", "https://github.example.com/api/graphql"),
    ],
)
def test_the_graphql_endpoint_follows_the_rest_base_url(api: str, graphql: str) -> None:
    assert graphql_url_for(api) == graphql
    assert IssuesSettings(api_url=api).effective_graphql_url == graphql


def test_the_token_is_never_printed() -> None:
    settings = IssuesSettings(token="ghp_secretvalue", repository="acme/feedback")
    assert "ghp_secretvalue" not in repr(settings) and "ghp_secretvalue" not in str(settings)
    assert "ghp_secretvalue" not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"repository": "feedback"}, "owner/name"),
        ({"api_url": "api.github.com"}, "http"),
        ({"app_slug": "bad slug"}, "login or slug"),
    ],
)
def test_bad_settings_say_what_to_write(values: dict[str, str], match: str) -> None:
    from outbox_core import ConfigurationError

    with pytest.raises(ConfigurationError, match=match):
        IssuesSettings(**values)


@pytest.mark.parametrize("private", ["acme/feedback", "Acme/FEEDBACK"])
def test_the_private_repository_must_differ_from_the_filing_one_and_the_error_names_both(
    private: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox_core import ConfigurationError

    monkeypatch.setenv("OUTBOX_ISSUES_REPOSITORY", "acme/feedback")
    monkeypatch.setenv("OUTBOX_ISSUES_PRIVATE_REPOSITORY", private)
    with pytest.raises(ConfigurationError) as refused:
        IssuesSettings.load()
    message = str(refused.value)
    assert "OUTBOX_ISSUES_PRIVATE_REPOSITORY names the same repository as" in message
    assert "OUTBOX_ISSUES_REPOSITORY (acme/feedback)" in message and "\n" not in message


def test_a_bad_setting_stops_the_adapters_build_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outbox_core import ConfigurationError, OutboxSettings
    from outbox_issues import FileIssueAdapter

    monkeypatch.setenv("OUTBOX_ISSUES_REPOSITORY", "feedback")
    with pytest.raises(ConfigurationError, match="^OUTBOX_ISSUES_REPOSITORY: use owner/name"):
        FileIssueAdapter.build(OutboxSettings())
    monkeypatch.setenv("OUTBOX_ISSUES_REPOSITORY", "acme/feedback")
    monkeypatch.setenv("OUTBOX_ISSUES_REQUEST_TIMEOUT_SECONDS", "70")
    with pytest.raises(ConfigurationError, match="must be below the fence margin"):
        FileIssueAdapter.build(OutboxSettings())


def test_a_transport_that_retries_on_its_own_is_refused_for_writes() -> None:
    import httpx

    from outbox_core import ConfigurationError

    with pytest.raises(ConfigurationError, match="retries=0"):
        GitHubTracker(
            "https://api.github.com", TOKEN, transport=httpx.AsyncHTTPTransport(retries=2)
        )
    GitHubTracker("https://api.github.com", TOKEN, transport=httpx.AsyncHTTPTransport())


async def test_a_tracker_that_refuses_connections_is_not_sent_to(
    tracker_server: GitHubTestServer,
) -> None:
    """``refuse_connections``: an open connection is cut and a new one refused before any
    request is sent (NotSent, nothing recorded), until ``accept_connections`` on the same port."""
    async with client(tracker_server) as tracker:
        await tracker.create_issue(PUBLIC, title="before", body="b")
        port = tracker_server.port
        tracker_server.refuse_connections()
        with pytest.raises(NotSent):
            await tracker.create_issue(PUBLIC, title="refused", body="b")
        assert [issue.title for issue in tracker_server.issues_in(PUBLIC)] == ["before"]
        tracker_server.accept_connections()
        assert tracker_server.port == port
        await tracker.create_issue(PUBLIC, title="after", body="b")
    assert tracker_server.writes_of("create_issue") == 2
