"""SlackProvider and conformance_request: each fault the conformance suite switches on, checked
here through the real executor too (the suite checks the rules; this, the Slack outcome)."""

from __future__ import annotations

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack.testing import SlackProvider, SlackTestServer, conformance_request, serve_slack


@pytest.mark.parametrize(
    ("fault", "attempts"), [(None, 1), ("refuse", 2), ("drop", 2), ("stall", 2)]
)
def test_each_conformance_fault_ends_done_with_one_write(
    outbox_db: OutboxTestDatabase,
    slack_server: SlackTestServer,
    fault: str | None,
    attempts: int,
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=0, request_timeout_seconds=0.5)
    provider = SlackProvider(slack_server)
    request = conformance_request(outbox_db, "conformance:1", "canary-7f3a")
    if fault is not None:
        provider.fault(fault)  # type: ignore[arg-type]
    with outbox_db.connect() as conn:
        action_id = outbox_db.outbox.enqueue(conn, request).id

    for _ in range(5):
        outbox_db.drain()

    row = outbox_db.rows(
        "SELECT state, stop_reason, attempt FROM {schema}.agent_action WHERE id = %s", (action_id,)
    )
    assert row == [(str(ActionState.DONE), StopReason.COMPLETED, attempts)]
    assert provider.writes(request) == 1
    assert provider.requests() >= 1
