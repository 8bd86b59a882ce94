"""The core's one rule for read-backs (issue 31, item 5): writes are bounded by attempts, reads by
time. A Reread from an attempt that called begin_write() counts an attempt; one from an attempt
that only read counts none, waits a time that grows with jitter from the kind's reread_base to
its reread_cap, and once the kind's unreadable_for has passed since the write started (from
write_started_at to the attempt's claim, both on the database clock) ends the action UNCERTAIN
READBACK_UNAVAILABLE."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Done,
    KindRegistry,
    Reread,
    StopReason,
)
from outbox_core.errors import RegistrationError
from outbox_core.executor.outcomes import AttemptFacts, decide, reread_backoff
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .loopback import LoopbackAdapter, LoopbackServer
from .test_results import enqueue, row, written_before
from .test_wakeups import running, until

BASE = ActionAdapter.reread_base
CAP = ActionAdapter.reread_cap
WINDOW = ActionAdapter.unreadable_for
WRITTEN = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def facts(*, age: timedelta | None, began_write: bool = False, number: int = 2) -> AttemptFacts:
    """An attempt claimed ``age`` after the action's write started (None: no write started)."""
    return AttemptFacts(
        1,
        "TEST_SCRIPTED",
        "lane",
        number,
        number,
        3,
        False,
        began_write,
        began_write,
        ActionAdapter.retry_base,
        ActionAdapter.retry_cap,
        BASE,
        CAP,
        WINDOW,
        None if age is None else WRITTEN,
        WRITTEN + (age or timedelta(0)),
    )


def delay(attempt: AttemptFacts, result: Reread) -> timedelta:
    ending = decide(attempt, result)
    assert ending is not None and ending.delay is not None
    return ending.delay


def test_the_cores_wait_after_a_reread_grows_with_jitter_within_base_and_cap() -> None:
    for seconds in (0, 0.5, 1, 3, 10, 60, 119, 120, 600, 3600):
        waited = timedelta(seconds=seconds)
        ceiling = min(CAP, max(BASE, waited))
        for _ in range(50):
            wait = reread_backoff(waited, BASE, CAP)
            assert BASE <= wait <= CAP
            assert max(BASE, ceiling / 2) <= wait <= ceiling
    assert {reread_backoff(timedelta(0), BASE, CAP) for _ in range(5)} == {BASE}
    jittered = {reread_backoff(timedelta(minutes=1), BASE, CAP) for _ in range(20)}
    assert len(jittered) > 1
    # Through decide(): the Reread without `after` of an attempt that only read waits longer
    # the longer its write has been unread.
    soon = [delay(facts(age=timedelta(seconds=2)), Reread()) for _ in range(20)]
    late = [delay(facts(age=timedelta(minutes=10)), Reread()) for _ in range(20)]
    assert max(soon) <= timedelta(seconds=2) < CAP / 2 <= min(late)


def test_an_adapters_own_reread_wait_is_kept_and_cut_at_the_end_of_the_read_window() -> None:
    own = timedelta(seconds=37)
    assert delay(facts(age=timedelta(minutes=1)), Reread(after=own)) == own
    # An attempt that wrote is bounded by attempts: its wait is used as given.
    hour = timedelta(hours=1)
    assert delay(facts(age=timedelta(minutes=14), began_write=True), Reread(after=hour)) == hour
    # An attempt that only read: the next read comes no later than the window's end.
    left = timedelta(seconds=10)
    cut = delay(facts(age=WINDOW - left), Reread(after=timedelta(minutes=5)))
    assert cut == left
    assert delay(facts(age=WINDOW - left), Reread()) <= left


async def test_a_reread_from_an_attempt_that_only_read_counts_no_attempt(
    db: OutboxTestDatabase,
) -> None:
    """Every Reread counted: a read-back outage of a few reads spent all the attempts and
    ended UNCERTAIN ATTEMPTS_EXHAUSTED, for a person to decide."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if not attempt.write_started:
            assert await attempt.fence().begin_write()
            return Reread(detail="HTTP 502 after the create call")
        if len(ScriptedAdapter.calls) <= 5:
            return Reread(detail="GET HTTP 503: not read")
        return Done("found")

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=2)
    for _ in range(5):
        await db.adrain()
        got = row(db, action_id)
        assert (got["state"], got["attempt"]) == ("EXECUTING", 1)
    await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["readback_ref"], got["attempt"]) == ("DONE", "found", 2)
    assert [c["attempt"] for c in ScriptedAdapter.calls] == [1, 2, 2, 2, 2, 2]


async def test_a_reread_from_an_attempt_that_fenced_counts_and_ends_uncertain_at_the_last_attempt(
    db: OutboxTestDatabase,
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        # Reads back, finds nothing, writes again: the answer is lost each time.
        assert await attempt.fence().begin_write()
        return Reread(detail="HTTP 502 after the create call")

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=2)
    await db.adrain()
    assert (row(db, action_id)["state"], row(db, action_id)["attempt"]) == ("EXECUTING", 1)
    await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["stop_reason"]) == ("UNCERTAIN", StopReason.ATTEMPTS_EXHAUSTED)
    assert [c["attempt"] for c in ScriptedAdapter.calls] == [1, 2]


async def test_a_read_only_reread_past_unreadable_for_on_the_database_clock_is_readback_unavailable(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """The window runs from write_started_at to the claim, both the database's: the writes here
    started 14 and 16 minutes ago by the database clock, however long the test took."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        return Reread(detail="conversations.history HTTP 503: not read")

    ScriptedAdapter.script = run
    inside = enqueue(db, key="inside", lane="a", max_attempts=1)
    past = enqueue(db, key="past", lane="b", max_attempts=1)
    written_before(db, inside, WINDOW - timedelta(minutes=1))
    written_before(db, past, WINDOW + timedelta(minutes=1))
    with caplog.at_level(logging.INFO, logger="outbox"):
        await db.adrain()
    assert (row(db, inside)["state"], row(db, inside)["attempt"]) == ("EXECUTING", 0)
    got = row(db, past)
    assert (got["state"], got["stop_reason"]) == ("UNCERTAIN", StopReason.READBACK_UNAVAILABLE)
    ended = [r for r in caplog.records if getattr(r, "event", None) == "action.ended.uncertain"]
    assert [(getattr(r, "action.id"), getattr(r, "action.stop_reason")) for r in ended] == [
        (past, StopReason.READBACK_UNAVAILABLE)
    ]
    assert ScriptedAdapter.endings == [(past, "UNCERTAIN", StopReason.READBACK_UNAVAILABLE)]


async def test_last_detail_keeps_what_the_last_read_saw(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        return Reread(detail=f"listing lag: the write is not visible yet (read {attempt.run})")

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=1)
    written_before(db, action_id, timedelta(minutes=1))
    for read in (1, 2):
        await db.adrain()
        assert db.scalar(
            "SELECT last_detail FROM {schema}.agent_action WHERE id = %s", (action_id,)
        ) == (f"listing lag: the write is not visible yet (read {read})")
    # The kind's window is shorter than the write's age now: the next read gives up.
    monkeypatch.setattr(ScriptedAdapter, "unreadable_for", timedelta(seconds=30))
    await db.adrain()
    ended = db.rows(
        "SELECT state, stop_reason, last_detail FROM {schema}.agent_action WHERE id = %s",
        (action_id,),
    )
    assert ended == [
        (
            "UNCERTAIN",
            StopReason.READBACK_UNAVAILABLE,
            "listing lag: the write is not visible yet (read 3)",
        )
    ]


class QuickRereads(LoopbackAdapter):
    """The loopback read-back kind with waits of a few tens of milliseconds between reads."""

    kind = "TEST_LOOPBACK_QUICK"
    reread_base: ClassVar[timedelta] = timedelta(milliseconds=20)
    reread_cap: ClassVar[timedelta] = timedelta(milliseconds=100)


async def test_an_executor_run_outlasting_its_attempts_on_an_unreadable_provider_ends_done(
    db: OutboxTestDatabase,
) -> None:
    """The write's answer is lost, then the provider cannot be read for more reads than the
    action has attempts: the running executor keeps reading (none of those reads counts) and
    the action ends DONE, one effect, once the provider can be read again."""
    unreadable_reads = 6
    with LoopbackServer() as server:
        QuickRereads.port = server.port
        db.register_kind(QuickRereads)
        server.fault("drop")
        with db.connect() as conn:
            request = ActionRequest(
                QuickRereads.kind, "lane", "k", payload={"text": "hi"}, max_attempts=2
            )
            action_id = db.outbox.enqueue(conn, request).id
            conn.commit()
        server.fault("unreadable")

        def state() -> str:
            return str(row(db, action_id)["state"])

        async with running(db, registered_first=False, poll_seconds=0.05):
            await until(
                lambda: (
                    server.unreadable_reads >= unreadable_reads
                    or state() not in ("ADMITTED", "EXECUTING")
                ),
                "the executor stopped reading back",
                seconds=60,
            )
            assert state() == "EXECUTING"
            server.clear_faults()
            await until(lambda: state() != "EXECUTING", "the executor stopped reading back", 60)
    got: dict[str, Any] = row(db, action_id)
    assert (got["state"], got["readback_ref"], got["attempt"]) == ("DONE", f"effect-{action_id}", 2)
    assert server.held("k") == 1
    assert server.unreadable_reads >= unreadable_reads > 2


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"reread_base": timedelta(0)}, "reread_base (0:00:00) must be above zero"),
        ({"reread_cap": timedelta(milliseconds=10)}, "must be above zero and at most reread_cap"),
        ({"unreadable_for": timedelta(0)}, "unreadable_for (0:00:00) must be above zero"),
        ({"unreadable_for": 900}, "unreadable_for is int; it must be a timedelta"),
    ],
)
def test_a_kind_whose_read_back_waits_cannot_work_is_refused_at_registration(
    values: dict[str, Any], problem: str
) -> None:
    broken = type("Broken", (ScriptedAdapter,), {"kind": "TEST_BROKEN", **values})
    with pytest.raises(RegistrationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        KindRegistry().register(broken)
