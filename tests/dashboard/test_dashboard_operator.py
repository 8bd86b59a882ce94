"""The operator's forms on an action's page, over HTTP against a real database: each change,
a refusal shown as the page's notice, a stale form key refused, and the audit row's surface."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import Seeded


def _key(client: TestClient, action_id: int) -> str:
    page = client.get(f"/action/{action_id}")
    assert page.status_code == 200
    found = re.search(r'name="form_key" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _state(db: OutboxTestDatabase, action_id: int) -> object:
    return db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (action_id,))


def test_resolve_done_from_the_action_page_ends_it_done_audited_as_the_dashboard(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url, user="ops-alice"))
    key = _key(client, seeded.uncertain)
    response = client.post(
        f"/action/{seeded.uncertain}/resolve-done",
        data={"form_key": key, "ref": "msg-42", "reason": "found it at the provider"},
    )
    assert response.status_code == 200 and "resolved action" in response.text
    assert _state(db, seeded.uncertain) == "DONE"
    row = db.scalar(
        "SELECT surface || '/' || actor || '/' || reason FROM {schema}.action_audit "
        "WHERE action_id = %s",
        (seeded.uncertain,),
    )
    assert row == "dashboard/ops-alice/found it at the provider"


def test_resolve_not_done_ends_it_failed_and_the_actor_defaults_to_dashboard(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    response = client.post(
        f"/action/{seeded.uncertain}/resolve-absent",
        data={"form_key": _key(client, seeded.uncertain), "reason": "not in the provider"},
    )
    assert response.status_code == 200
    assert _state(db, seeded.uncertain) == "FAILED"
    actor = db.scalar(
        "SELECT actor FROM {schema}.action_audit WHERE action_id = %s", (seeded.uncertain,)
    )
    assert actor == "dashboard"


def test_retry_of_a_failed_action_enqueues_a_new_one(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    old = seeded.failed[0]
    response = client.post(
        f"/action/{old}/retry", data={"form_key": _key(client, old), "reason": "provider fixed"}
    )
    assert response.status_code == 200 and "#retry-1" in response.text
    count = db.scalar(
        "SELECT count(*) FROM {schema}.agent_action WHERE idempotency_key LIKE %s",
        ("%#retry-1",),
    )
    assert count == 1


def test_resolving_an_action_that_is_not_uncertain_is_the_pages_notice_not_a_500(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    done = seeded.done[0]
    response = client.post(
        f"/action/{done}/resolve-absent",
        data={"form_key": _key(client, seeded.uncertain), "reason": "x"},
    )
    assert response.status_code == 409
    assert "only an UNCERTAIN action is resolved" in response.text
    assert _state(db, done) == "DONE"


def test_a_read_back_of_an_action_whose_write_never_started_is_refused(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    response = client.post(
        f"/action/{seeded.uncertain}/resolve-retry",
        data={"form_key": _key(client, seeded.uncertain), "reason": "read it back"},
    )
    assert response.status_code == 409
    assert _state(db, seeded.uncertain) == "UNCERTAIN"


def test_a_stale_form_key_or_a_missing_reason_changes_nothing(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    stale = _key(TestClient(create_app(db.outbox, db.url)), seeded.uncertain)
    client = TestClient(create_app(db.outbox, db.url))
    response = client.post(
        f"/action/{seeded.uncertain}/resolve-absent", data={"form_key": stale, "reason": "x"}
    )
    assert response.status_code == 403
    response = client.post(
        f"/action/{seeded.uncertain}/resolve-absent",
        data={"form_key": _key(client, seeded.uncertain), "reason": "  "},
    )
    assert response.status_code == 400
    assert _state(db, seeded.uncertain) == "UNCERTAIN"
