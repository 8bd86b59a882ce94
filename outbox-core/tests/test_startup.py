"""Start-up: a kind whose adapter cannot be built stops that kind, not every kind."""

from __future__ import annotations

import logging
from typing import Any, Self

import pytest

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionState,
    ActionVariants,
    AdapterResult,
    ConfigurationError,
    Done,
    OutboxSettings,
)
from outbox_core.executor import Executor
from outbox_core.status import collect_status
from outbox_core.testing import OutboxTestDatabase

from .kinds import Step

MESSAGE = "OUTBOX_MISCONFIGURED_TIMEOUT_SECONDS (45.0) must be below the fence margin"


class MisconfiguredAdapter(ActionAdapter):
    """A kind whose settings cannot run with the core's: its build raises, as outbox-email's
    does when its send timeout is not below the fence margin."""

    kind = "TEST_MISCONFIGURED"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        if settings.fence_margin_seconds < 45:
            raise ConfigurationError(f"{MESSAGE} ({settings.fence_margin_seconds} s)")
        return cls()

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class ExplodingAdapter(MisconfiguredAdapter):
    """An adapter whose construction raises something that is not a configuration error."""

    kind = "TEST_EXPLODING"

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        raise RuntimeError("the provider SDK is missing a symbol")


@pytest.fixture
def mixed(db: OutboxTestDatabase) -> OutboxTestDatabase:
    db.register_kind(MisconfiguredAdapter)
    db.register_kind(ExplodingAdapter)
    db.configure(fence_margin_seconds=30.0, strict_startup=False)
    with db.connect() as conn:
        for kind in ("TEST_NOOP", "TEST_MISCONFIGURED", "TEST_EXPLODING"):
            db.outbox.enqueue(conn, ActionRequest(kind, f"lane-{kind}", f"key-{kind}"))
        conn.commit()
    return db


def states(db: OutboxTestDatabase) -> dict[str, ActionState]:
    rows = db.rows("SELECT kind, state FROM {schema}.agent_action")
    return {kind: ActionState(state) for kind, state in rows}


def test_the_test_harness_starts_executors_strictly(db: OutboxTestDatabase) -> None:
    assert db.settings.strict_startup


async def test_a_kind_whose_adapter_cannot_be_built_stops_that_kind_only(
    mixed: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="outbox")
    async with mixed.executor() as executor:
        await executor.drain()
        assert [kind.kind for kind in executor.stopped] == ["TEST_EXPLODING", "TEST_MISCONFIGURED"]
        assert "TEST_MISCONFIGURED" not in executor.kinds
        assert "TEST_NOOP" in executor.kinds
        gauge = dict(executor.rt.instruments.stopped)
    assert states(mixed) == {
        "TEST_NOOP": ActionState.DONE,
        "TEST_MISCONFIGURED": ActionState.ADMITTED,  # queued for an executor that can run it
        "TEST_EXPLODING": ActionState.ADMITTED,
    }
    assert (
        mixed.scalar("SELECT max(attempt) FROM {schema}.agent_action WHERE kind <> 'TEST_NOOP'")
        == 0
    )
    logged = {
        record.__dict__["kind"]: record.__dict__["error"]
        for record in caplog.records
        if record.__dict__.get("event") == "executor.kind.stopped"
    }
    assert MESSAGE in logged["TEST_MISCONFIGURED"]
    assert logged["TEST_EXPLODING"] == "RuntimeError: the provider SDK is missing a symbol"
    assert gauge["TEST_MISCONFIGURED"] == 1
    assert gauge["TEST_EXPLODING"] == 1
    assert gauge["TEST_NOOP"] == 0


async def test_strict_start_up_refuses_to_open_naming_the_kind_and_its_error(
    mixed: OutboxTestDatabase,
) -> None:
    executor = mixed.executor(strict_startup=True)
    with pytest.raises(ConfigurationError, match=r"strict start-up: .*TEST_MISCONFIGURED.*"):
        await executor.open()
    assert executor.pool is None  # refused before it opened a connection
    assert states(mixed)["TEST_NOOP"] == ActionState.ADMITTED


async def test_an_executor_none_of_whose_kinds_can_run_refuses_to_open(
    mixed: OutboxTestDatabase,
) -> None:
    executor = Executor(
        mixed.outbox, mixed.url, settings=mixed.settings, kinds=["TEST_MISCONFIGURED"]
    )
    with pytest.raises(ConfigurationError, match="no kind this executor serves can run"):
        await executor.open()


def test_status_lists_the_kinds_an_executor_would_stop(mixed: OutboxTestDatabase) -> None:
    with mixed.connect() as conn:
        report = collect_status(conn, mixed.outbox)
    stopped: dict[str, Any] = {kind.kind: kind for kind in report.stopped}
    assert sorted(stopped) == ["TEST_EXPLODING", "TEST_MISCONFIGURED"]
    assert MESSAGE in stopped["TEST_MISCONFIGURED"].error
    assert report.as_dict()["stopped_kinds"][1]["kind"] == "TEST_MISCONFIGURED"
