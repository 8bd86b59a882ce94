"""Capacity: the proxy's own refusal defers the draft (no attempt spent, the filing
DRAFT_WAITING and back), in every wording of the one capacity table, which the README restates;
calls in flight per executor are the core's per-kind limit, and the optional cross-replica limit
is kept in PostgreSQL."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import get_args

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_draft import DraftReportAdapter
from outbox_draft.capacity import CAPACITY, CapacityWording
from outbox_draft.gateway import ProxyBusy, classify
from outbox_draft.testing import CANNED, MODEL, ModelTestServer, serve_draft
from outbox_draft.testing.server import CapacityName, capacity_body
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import (
    action,
    drain_until_ended,
    enqueue_draft,
    filing,
    filing_states,
    log_filing_states,
    store_report,
    submit,
)

CLAIMED, WAITING = "DRAFT_CLAIMED", "DRAFT_WAITING"
README = Path(__file__).parents[1] / "README.md"


def test_litellms_parallel_limit_defers_so_five_reports_at_once_all_get_their_draft(
    filing_db: OutboxTestDatabase, model_server: ModelTestServer, tracker_server: GitHubTestServer
) -> None:
    # Five drafts in flight at once against a deployment of max_parallel_requests 2: the two
    # first are held at the server until the other three were refused with LiteLLM's 429.
    serve_draft(filing_db, model_server, max_concurrency=5)
    model_server.parallel_limit(2)
    model_server.hold_answers()

    def release_once_three_were_refused() -> None:
        model_server.wait_until(lambda server: server.parallel_refused >= 3, timeout=60)
        model_server.release_answers()

    releaser = threading.Thread(target=release_once_three_were_refused, daemon=True)
    releaser.start()
    reports = [f"r{n}" for n in range(5)]
    for report in reports:
        submit(filing_db, report)

    for _ in range(20):
        filing_db.drain()
        if all(action(filing_db, f"file_issue:{r}:1")[0].ended for r in reports):
            break
    releaser.join(timeout=5)

    assert model_server.parallel_refused >= 3  # LiteLLM's parallel limit was met
    for report in reports:
        # Deferred, never retried: every draft DONE at its first counted attempt.
        assert action(filing_db, f"draft:{report}:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    issues = tracker_server.issues_in(PUBLIC)
    assert len(issues) == 5
    assert {issue.title for issue in issues} == {CANNED.split("\n\n")[0]}  # each the draft's


@pytest.mark.parametrize("wording", CAPACITY, ids=[w.name for w in CAPACITY])
def test_each_capacity_wording_of_the_table_defers_the_draft_without_spending_an_attempt(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer, wording: CapacityWording
) -> None:
    store_report(draft_db)
    model_server.capacity(wording=wording.name)  # type: ignore[arg-type]
    enqueue_draft(draft_db)

    drain_until_ended(draft_db, "draft:r1:1")

    assert action(draft_db, "draft:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert len(model_server.completions()) == 2


def test_the_loopback_server_sends_each_capacity_wording_of_the_table_with_the_real_body() -> None:
    assert set(get_args(CapacityName)) == {wording.name for wording in CAPACITY}
    for wording in CAPACITY:
        status, body = capacity_body(wording.name, MODEL)  # type: ignore[arg-type]
        read = classify(status, body, {}, MODEL)
        assert isinstance(read, ProxyBusy) and read.wording is wording, wording.name


def readme_row(wording: CapacityWording) -> str:
    return f"| {wording.server} | {wording.status} | {wording.words} | {wording.limit} | {wording.seen} |"


def test_the_readme_restates_the_capacity_table_row_by_row() -> None:
    text = README.read_text("utf-8")
    section = text[text.index("### Capacity refusals") :]
    section = section[: section.index("\n#")]
    rows = [line for line in section.splitlines() if re.match(r"\| (LiteLLM|Ollama) \|", line)]
    assert rows == [readme_row(wording) for wording in CAPACITY]


def test_five_capacity_refusals_in_a_row_spend_no_attempt_and_the_draft_still_runs(
    filing_db: OutboxTestDatabase, model_server: ModelTestServer, tracker_server: GitHubTestServer
) -> None:
    log_filing_states(filing_db)
    model_server.capacity(times=5)

    submit(filing_db)  # three attempts
    drain_until_ended(filing_db, "draft:r1:1")
    filing_db.drain()

    assert action(filing_db, "draft:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert (
        filing_db.scalar(
            "SELECT epoch FROM {schema}.agent_action WHERE idempotency_key = 'draft:r1:1'"
        )
        == 6
    )  # six claims, one attempt counted
    assert len(model_server.completions()) == 6
    assert filing_states(filing_db) == [CLAIMED, WAITING] * 5 + [
        CLAIMED,
        "ANSWERED",
        "FILING",
        "FILED",
    ]
    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.title == "Export does nothing on an empty list"  # the draft's


def test_the_proxys_retry_after_is_the_deferrals_wait(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    store_report(draft_db)
    model_server.capacity(retry_after=600)
    enqueue_draft(draft_db)

    draft_db.drain()

    state, _, attempts = action(draft_db, "draft:r1:1")
    assert (state, attempts) == (ActionState.ADMITTED, 0)
    wait = draft_db.scalar(
        "SELECT extract(epoch FROM due_at - now()) FROM {schema}.agent_action "
        "WHERE idempotency_key = 'draft:r1:1'"
    )
    assert 500 < wait <= 600
    assert filing(draft_db).state.value == WAITING


def test_calls_in_flight_per_executor_are_the_kinds_max_concurrency(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    adapter = serve_draft(draft_db, model_server, max_concurrency=2)
    built = adapter.build(draft_db.settings)
    assert isinstance(built, DraftReportAdapter) and built.max_concurrency == 2
    model_server.delay_seconds = 0.3
    for n in range(6):
        store_report(draft_db, f"r{n}")
        enqueue_draft(draft_db, f"r{n}")

    draft_db.drain()

    assert [action(draft_db, f"draft:r{n}:1")[0] for n in range(6)] == [ActionState.DONE] * 6
    assert 1 <= model_server.max_in_flight <= 2


def test_a_full_cross_replica_limit_defers_the_draft_until_a_slot_frees(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    serve_draft(draft_db, model_server, max_in_flight_total=1)
    log_filing_states(draft_db)
    # Another replica's call holds the only slot for two more seconds.
    draft_db.execute(
        "INSERT INTO {schema}.draft_slot (slot, action_id, epoch, held_until) "
        "VALUES (1, -1, 1, now() + interval '2 seconds')"
    )
    store_report(draft_db)
    enqueue_draft(draft_db)

    drain_until_ended(draft_db, "draft:r1:1", rounds=40)

    assert action(draft_db, "draft:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    states = filing_states(draft_db)
    assert states[:2] == [CLAIMED, WAITING] and states[-2:] == [CLAIMED, "ANSWERED"]
    assert len(model_server.completions()) == 1  # no call while the limit was full
    assert draft_db.rows("SELECT slot, action_id, held_until FROM {schema}.draft_slot") == [
        (1, None, None)
    ]  # released after the call


def test_a_call_that_failed_releases_its_slot(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    serve_draft(draft_db, model_server, max_in_flight_total=2)
    model_server.unknown_model()
    store_report(draft_db)
    enqueue_draft(draft_db)

    draft_db.drain()

    assert action(draft_db, "draft:r1:1")[1] == StopReason.NOT_CONFIGURED
    assert (
        draft_db.scalar("SELECT count(*) FROM {schema}.draft_slot WHERE held_until IS NOT NULL")
        == 0
    )
