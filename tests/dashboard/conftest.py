"""A database with actions in every state, and a dashboard served on it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
import uvicorn
from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    Done,
    Failed,
    KindRegistry,
    Uncertain,
)
from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

TOKEN = "a-token-of-the-tests-0123456789"


class Demo(BaseModel):
    outcome: Literal["done", "failed", "uncertain"] = "done"


class DemoAdapter(ActionAdapter):
    """Ends each action as its payload says."""

    kind = "DASH_DEMO"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Demo)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        match attempt.payload.get("outcome"):
            case "failed":
                return Failed("REFUSED")
            case "uncertain":
                return Uncertain()
        return Done(f"ref-{attempt.id}")


class OtherAdapter(DemoAdapter):
    kind = "DASH_OTHER"


@dataclass
class Seeded:
    """The ids of the seeded actions, by what they are."""

    done: list[int]
    failed: list[int]
    uncertain: int
    cancelled: int
    proposed: int
    executing: int
    admitted_due: int
    waiting_head: int
    behind_waiting_head: int


def _enqueue(db: OutboxTestDatabase, request: ActionRequest) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, request).id
        conn.commit()
    return action_id


def seed(db: OutboxTestDatabase) -> Seeded:
    """three DONE, two FAILED, UNCERTAIN, CANCELLED (ended by a drain), then PROPOSED, EXECUTING,
    ADMITTED and due, and a lane blocked by a head that waits an hour."""
    later = datetime.now(UTC) + timedelta(hours=1)
    done = [_enqueue(db, ActionRequest("DASH_DEMO", f"done-{n}", f"done-{n}")) for n in range(3)]
    failed = [
        _enqueue(db, ActionRequest("DASH_DEMO", f"fail-{n}", f"fail-{n}", Demo(outcome="failed")))
        for n in range(2)
    ]
    uncertain = _enqueue(
        db, ActionRequest("DASH_OTHER", "unsure", "unsure", Demo(outcome="uncertain"))
    )
    cancelled = _enqueue(db, ActionRequest("DASH_DEMO", "cancel-me", "cancel-me"))
    with db.connect() as conn:
        db.outbox.cancel(conn, cancelled)
        conn.commit()
    db.drain()
    proposed = _enqueue(db, ActionRequest("DASH_DEMO", "proposal", "proposal", proposed=True))
    executing = _enqueue(db, ActionRequest("DASH_DEMO", "running", "running"))
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, "
        "lease_until = now() + interval '1 hour' WHERE id = %s",
        (executing,),
    )
    admitted_due = _enqueue(db, ActionRequest("DASH_DEMO", "due", "due"))
    waiting_head = _enqueue(
        db, ActionRequest("DASH_OTHER", "blocked", "blocked-head", not_before=later)
    )
    behind = _enqueue(db, ActionRequest("DASH_OTHER", "blocked", "blocked-behind"))
    return Seeded(
        done, failed, uncertain, cancelled, proposed, executing, admitted_due, waiting_head, behind
    )


@pytest.fixture
def db(outbox_db: OutboxTestDatabase) -> OutboxTestDatabase:
    outbox_db.registry = KindRegistry()
    outbox_db.register_kind(DemoAdapter)
    outbox_db.register_kind(OtherAdapter)
    return outbox_db


@pytest.fixture
def seeded(db: OutboxTestDatabase) -> Seeded:
    return seed(db)


class Served:
    def __init__(self, db: OutboxTestDatabase, token: str | None) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = create_app(db.outbox, db.url, token=token)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=3
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the dashboard did not stop"


@pytest.fixture
def served(db: OutboxTestDatabase) -> Iterator[Served]:
    with Served(db, None) as served:
        yield served


@pytest.fixture
def served_with_token(db: OutboxTestDatabase) -> Iterator[Served]:
    with Served(db, TOKEN) as served:
        yield served
