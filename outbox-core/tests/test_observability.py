"""Metrics labelled by kind, and log events with stable names that never carry the payload."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done, Failed, Retry
from outbox_core.observability import Tally
from outbox_core.status import collect_status
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter

READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


def totals(name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    """Cumulative value per attribute set (counters add up across tests: compare deltas)."""
    return {tuple(sorted(attrs.items())): value for attrs, value in points(name)}


def delta(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    return {
        key: value - before.get(key, 0)
        for key, value in after.items()
        if value != before.get(key, 0)
    }


def points(name: str) -> list[tuple[dict[str, Any], float]]:
    data = READER.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(
                        (dict(p.attributes or {}), p.value) for p in metric.data.data_points
                    )
    return found


async def test_attempts_and_endings_are_counted_by_kind_and_logged_without_the_payload(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    async def refuse(attempt: ActionAttempt) -> AdapterResult:
        return Failed("REFUSED")

    ScriptedAdapter.script = refuse
    with db.connect() as conn:
        db.outbox.enqueue(
            conn,
            ActionRequest("TEST_SCRIPTED", "lane", "k", payload={"n": 1, "note": "SECRET-PAYLOAD"}),
        )
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane2", "k2"))
        conn.commit()
    attempts_before, ended_before = totals("action.attempts"), totals("action.ended")
    with caplog.at_level(logging.DEBUG, logger="outbox"):
        async with db.executor() as executor:
            await executor.drain()
            snapshot = await executor.sample_backlog()
    assert delta(attempts_before, totals("action.attempts")) == {
        (("kind", "TEST_NOOP"), ("result", "Done")): 1,
        (("kind", "TEST_SCRIPTED"), ("result", "Failed")): 1,
    }
    assert delta(ended_before, totals("action.ended")) == {
        (("kind", "TEST_NOOP"), ("state", "DONE"), ("stop_reason", "COMPLETED")): 1,
        (("kind", "TEST_SCRIPTED"), ("state", "FAILED"), ("stop_reason", "REFUSED")): 1,
    }
    events = [r for r in caplog.records if getattr(r, "event", None) == "action.ended.failed"]
    assert len(events) == 1
    assert (
        getattr(events[0], "action.kind") == "TEST_SCRIPTED" and getattr(events[0], "action.id") > 0
    )
    assert all(
        "SECRET-PAYLOAD" not in r.getMessage() and "SECRET-PAYLOAD" not in str(r.__dict__)
        for r in caplog.records
    )
    assert snapshot.due == {} and snapshot.executing == {}


async def test_the_backlog_gauges_count_due_and_blocked_lanes_by_kind(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        for index in range(3):
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", f"lane-{index}", f"k{index}"))
        conn.commit()
    db.execute("UPDATE {schema}.agent_action SET due_at = now() - interval '5 s'")
    async with db.executor() as executor:
        await executor.sample_backlog()
    due = {tuple(sorted(a.items())): v for a, v in points("action.backlog.due")}
    assert due[(("kind", "TEST_NOOP"),)] == 3
    ages = {a["kind"]: v for a, v in points("action.backlog.oldest_due_age")}
    assert ages["TEST_NOOP"] >= 5


async def test_a_lane_is_blocked_only_while_its_head_waits_with_an_action_behind_it(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        for lane, count in (("waits-with-tail", 2), ("waits-alone", 1), ("due-pair", 2)):
            for index in range(count):
                db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", lane, f"{lane}-{index}"))
        conn.commit()
    # The heads of the first two lanes wait out a backoff.
    db.execute(
        "UPDATE {schema}.agent_action SET due_at = now() + interval '1 hour'"
        " WHERE idempotency_key IN ('waits-with-tail-0', 'waits-alone-0')"
    )
    async with db.executor() as executor:
        snapshot = await executor.sample_backlog()
        assert snapshot.lanes_blocked == {"TEST_NOOP": 1}
        with db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "waits-alone", "waits-alone-1"))
            conn.commit()
        # Between full counts the maintenance loop keeps the last count of blocked lanes.
        kept = await executor.sample_backlog(blocked=False)
        assert kept.lanes_blocked == {"TEST_NOOP": 1}
        counted = await executor.sample_backlog()
        assert counted.lanes_blocked == {"TEST_NOOP": 2}
    blocked = {a["kind"]: v for a, v in points("action.lanes.blocked")}
    assert blocked["TEST_NOOP"] == 2


def test_a_tally_adds_each_series_once_when_flushed() -> None:
    counter = metrics.get_meter("outbox-tally-test").create_counter("tally.test")
    tally = Tally()
    before = totals("tally.test")
    for _ in range(3):
        tally.add(counter, ("kind", "A"), ("state", "DONE"))
    tally.add(counter, ("kind", "B"), ("state", "DONE"))
    assert delta(before, totals("tally.test")) == {}
    tally.flush()
    expected = {(("kind", "A"), ("state", "DONE")): 3, (("kind", "B"), ("state", "DONE")): 1}
    assert delta(before, totals("tally.test")) == expected
    tally.flush()  # nothing gathered since: nothing added
    assert delta(before, totals("tally.test")) == expected


async def test_lanes_blocked_counts_a_head_that_a_chained_claim_found(
    db: OutboxTestDatabase,
) -> None:
    """A chained claim leaves the lane row alone seven times in eight, so action_lane.head_id
    may still name the ended head. The gauge took the head from head_id alone, found it
    ended, and missed the lane; it now finds the head as the claim does."""
    lanes = 24

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.idempotency_key.endswith("-0"):
            return Done()
        return Retry(timedelta(hours=1))  # the next head waits out a backoff

    ScriptedAdapter.script = run
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn,
            [
                ActionRequest("TEST_SCRIPTED", f"lane-{lane}", f"l{lane}-{index}")
                for lane in range(lanes)
                for index in range(3)
            ],
        )
        conn.commit()
    async with db.executor() as executor:
        await executor.drain()
        assert (
            db.scalar(
                "SELECT count(*) FROM {schema}.agent_action WHERE state = 'ADMITTED' "
                "AND due_at > now() + interval '50 minutes'"
            )
            == lanes
        )
        stale = db.scalar(
            "SELECT count(*) FROM {schema}.action_lane l JOIN {schema}.agent_action a "
            "ON a.id = l.head_id WHERE a.state = 'DONE'"
        )
        assert stale > 0  # the case this test is about
        snapshot = await executor.sample_backlog()
    assert snapshot.lanes_blocked == {"TEST_SCRIPTED": lanes}
    with db.connect() as conn:
        report = collect_status(conn, db.outbox)
    assert {status.kind: status.lanes_blocked for status in report.kinds}["TEST_SCRIPTED"] == lanes


async def test_actions_behind_a_head_in_backoff_wait_and_the_oldest_due_age_does_not_age_them(
    db: OutboxTestDatabase,
) -> None:
    """Due means a lane head that could start now. A head waiting out a long backoff and the
    actions queued behind it are waiting, however long ago those fell due: counted as due and
    aged, they fired the "actions not moving" alert on a healthy system."""

    async def backoff(attempt: ActionAttempt) -> AdapterResult:
        return Retry(timedelta(hours=1), detail="SMTP 451 4.7.1")

    ScriptedAdapter.script = backoff
    with db.connect() as conn:
        for index in range(3):
            db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "held", f"held-{index}"))
        conn.commit()
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        await asyncio.gather(*executor.attempts.dispatch(rows))
    # The actions behind the head have been due for an hour; a lane of its own is due.
    db.execute(
        "UPDATE {schema}.agent_action SET due_at = now() - interval '1 hour'"
        " WHERE idempotency_key IN ('held-1', 'held-2')"
    )
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "free", "free-0"))
        conn.commit()
    db.execute(
        "UPDATE {schema}.agent_action SET due_at = now() - interval '5 s'"
        " WHERE idempotency_key = 'free-0'"
    )
    async with db.executor() as executor:
        snapshot = await executor.sample_backlog()
    assert snapshot.due == {"TEST_NOOP": 1}
    assert snapshot.waiting == {"TEST_SCRIPTED": 3}
    assert "TEST_SCRIPTED" not in snapshot.oldest_due_age
    assert 5 <= snapshot.oldest_due_age["TEST_NOOP"] < 3600
    ages = {a["kind"]: v for a, v in points("action.backlog.oldest_due_age")}
    assert ages["TEST_SCRIPTED"] == 0
    waiting = {a["kind"]: v for a, v in points("action.backlog.waiting")}
    assert waiting["TEST_SCRIPTED"] == 3
    with db.connect() as conn:
        report = collect_status(conn, db.outbox)
    kinds = {k.kind: k for k in report.kinds}
    assert (kinds["TEST_SCRIPTED"].due, kinds["TEST_SCRIPTED"].waiting) == (0, 3)
    assert kinds["TEST_SCRIPTED"].oldest_due_age_seconds == 0
    assert (kinds["TEST_NOOP"].due, kinds["TEST_NOOP"].waiting) == (1, 0)


async def test_a_head_whose_lease_ran_out_is_due_not_executing(db: OutboxTestDatabase) -> None:
    """Nobody runs it (its executor died): a claim takes it again now, so it is due, and its
    age counts from the end of its lease."""
    with db.connect() as conn:
        for index in range(2):
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lost", f"lost-{index}"))
        conn.commit()
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(1)  # claimed, never run
        assert len(rows) == 1
        db.execute(
            "UPDATE {schema}.agent_action SET lease_until = now() - interval '30 s'"
            " WHERE state = 'EXECUTING'"
        )
        db.execute("UPDATE {schema}.action_lane SET next_at = now() - interval '30 s'")
        snapshot = await executor.sample_backlog()
    assert (snapshot.due, snapshot.executing, snapshot.waiting) == (
        {"TEST_NOOP": 1},
        {},
        {"TEST_NOOP": 1},
    )
    assert 30 <= snapshot.oldest_due_age["TEST_NOOP"] < 3600


async def test_an_operators_resolution_and_cancel_are_counted_as_endings(
    db: OutboxTestDatabase,
) -> None:
    from outbox_core.operator import cancel_unstarted, resolve_absent, retry

    from .operator_support import ended_by_executor, fence_then_uncertain

    uncertain = await ended_by_executor(db, fence_then_uncertain, "resolved-count")
    with db.connect() as conn:
        admitted = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane-c", "c")).id
        conn.commit()
    before = totals("action.ended")
    async with await db.aconnect() as conn:
        await resolve_absent(conn, db.outbox, uncertain, "checked the provider")
        await cancel_unstarted(conn, db.outbox, admitted)
        # A retry ends nothing: the old action stays as it ended, the new one is admitted.
        await retry(conn, db.outbox, uncertain, "run it again")
    assert delta(before, totals("action.ended")) == {
        (("kind", "TEST_SCRIPTED"), ("state", "FAILED"), ("stop_reason", "RESOLVED_ABSENT")): 1,
        (("kind", "TEST_NOOP"), ("state", "CANCELLED"), ("stop_reason", "OPERATOR_CANCELLED")): 1,
    }
