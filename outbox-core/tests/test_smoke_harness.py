from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase


def test_an_enqueued_noop_action_ends_done_after_drain(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "key-1"))
    assert db.drain() == 1
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"
