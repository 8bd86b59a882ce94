from __future__ import annotations

from typing import Any

import pytest

from outbox_core import ActionState
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.plugin_listed import plugin_listed_first
from outbox_slack import Entry, idempotency_key, post_turn
from outbox_slack.testing import SlackTestServer, serve_slack

CHANNEL = "C0TEST"
ENDED = {"DONE", "UNCERTAIN", "FAILED", "CANCELLED"}


pytest_collection_modifyitems = plugin_listed_first
"""The plugin's first test runs first: `outbox plugins` lists it and its kinds."""


@pytest.fixture
def slack_db(outbox_db: OutboxTestDatabase, slack_server: SlackTestServer) -> OutboxTestDatabase:
    """A fresh database whose SLACK_POST posts to the loopback server. The read-back window is
    0 here (a complete read proves absence at once); tests of the window set their own."""
    serve_slack(outbox_db, slack_server, readback_window_seconds=0.0)
    return outbox_db


def entries(turn: str, count: int = 1, *, channel: str = CHANNEL, **extra: Any) -> list[Entry]:
    return [
        Entry(f"{turn}-q{n}", "question" if n % 2 == 0 else "digest", channel, f"text {n}", **extra)
        for n in range(count)
    ]


def post(db: OutboxTestDatabase, turn: str, count: int = 1, **options: Any) -> int:
    """Post one turn in a transaction of its own; its action id."""
    thread_ts = options.pop("thread_ts", None)
    channel = options.pop("channel", CHANNEL)
    with db.connect() as conn:
        return post_turn(
            conn,
            turn,
            entries(turn, count, channel=channel, thread_ts=thread_ts),
            workspace_id="W1",
            outbox=db.outbox,
            **options,
        ).id


def action(db: OutboxTestDatabase, turn: str) -> tuple[ActionState, str | None, int] | None:
    """(state, stop reason, attempts counted) of the turn's action; None once removed."""
    return db.action_state(idempotency_key(turn))


def readback_ref(db: OutboxTestDatabase, turn: str) -> str | None:
    return db.scalar(
        "SELECT readback_ref FROM {schema}.agent_action WHERE idempotency_key = %s",
        (idempotency_key(turn),),
    )


def run_to_end(db: OutboxTestDatabase, turn: str, *, rounds: int = 20) -> None:
    """Drain until the turn's action ended: a Reread holds its lease past one drain()."""
    for _ in range(rounds):
        db.drain()
        state = action(db, turn)
        if state is None or str(state[0]) in ENDED:
            return
    raise AssertionError(f"turn {turn}: its action did not end in {rounds} drains: {state}")
