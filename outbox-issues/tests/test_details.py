"""What each FILE_ISSUE attempt leaves on the action as its detail: the HTTP status and
GitHub's message (or the transport's failure), never the token, the repository, the report's
text or its reporter."""

from __future__ import annotations

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_issues.testing import PUBLIC, TOKEN, GitHubTestServer
from outbox_issues.tracker import said

from .conftest import REPORTER, TEXT, submit
from .test_file_issue import KEY, TABLE

EXPECTED = {
    "primary limit 403": ("Defer", "HTTP 403 primary rate limit, waiting"),
    "primary limit 429": ("Defer", "HTTP 429 primary rate limit, waiting"),
    "secondary limit 403": ("Defer", "HTTP 403 secondary rate limit, waiting 60 s"),
    "secondary limit 429 with retry-after": (
        "Defer",
        "HTTP 429 secondary rate limit, waiting 5 s",
    ),
    "401": ("Failed", "HTTP 401 Bad credentials"),
    "403 (headers of a limit not reached)": (
        "Failed",
        "HTTP 403 Resource not accessible by integration",
    ),
    "404 repository gone": ("Failed", "HTTP 404"),
    "410 issues disabled": ("Failed", "HTTP 410 Issues are disabled for this repo"),
    "422 on the title": ("Failed", "HTTP 422 Validation Failed: title:invalid"),
    "422 on another field": ("Failed", "HTTP 422 Validation Failed"),
    "500": ("Reread", "HTTP 500 Server Error"),
    "502": ("Reread", "HTTP 502 Bad Gateway"),
    "dropped before recording": ("Reread", ""),
    "accepted then dropped": ("Reread", ""),
    "stalled before recording": ("Reread", ""),
    "accepted then stalled": ("Reread", ""),
}
SECRETS = (TOKEN, PUBLIC, REPORTER, TEXT[:20], "ada@", "Export does nothing", "http")


def detail(db: OutboxTestDatabase) -> tuple[str | None, str | None]:
    row = db.rows(
        "SELECT last_result, last_detail FROM {schema}.agent_action WHERE idempotency_key = %s",
        (KEY,),
    )[0]
    return row[0], row[1]


@pytest.mark.parametrize("case", [name for name in TABLE if name != "created"])
def test_each_tracker_failure_keeps_its_status_and_message_and_no_secret(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    TABLE[case].fault(tracker_server)
    submit(issues_db)
    issues_db.drain()
    result, text = detail(issues_db)
    expected_result, start = EXPECTED[case]
    assert result == expected_result and text is not None and text.startswith(start), text
    if not start:  # a transport failure: its type, and whether the request left
        assert text.endswith("after the request was sent"), text
    assert not any(secret in text for secret in SECRETS), text


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("Validation Failed", "Validation Failed"),
        (
            "API rate limit exceeded for user ID 12345.",
            "API rate limit exceeded for user ID \u2026",
        ),
        (
            "API rate limit exceeded for 10.0.0.1. But here's the good news",
            "API rate limit exceeded for \u2026",
        ),
        ("Not Found. See https://docs.github.com/rest", "Not Found"),
        ("Blocked for ada@example.com", "Blocked for \u2026"),
        ("Moved to acme/private", "Moved to \u2026"),
        ("", ""),
    ],
)
def test_a_detail_keeps_githubs_first_sentence_without_names_or_places(
    message: str, kept: str
) -> None:
    assert said(message) == kept
