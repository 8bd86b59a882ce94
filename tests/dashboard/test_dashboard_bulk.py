"""The search's bulk change, over HTTP against a real database: a preview that changes nothing
and lists what would change, a confirmation that changes exactly the previewed actions (audited
as the dashboard), a refusal when one changed meanwhile, and the guards (form key, reason,
filter, the states a change acts on)."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import Seeded


def _key(client: TestClient) -> str:
    page = client.get("/search", params={"kind": "DASH_DEMO"})
    assert page.status_code == 200 and 'id="bulk-form"' in page.text
    found = re.search(r'name="form_key" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def _confirmed_ids(text: str) -> str:
    found = re.search(r'name="ids" value="([^"]+)"', text)
    assert found is not None, text
    return found.group(1)


def test_a_bulk_retry_is_previewed_then_confirmed_on_exactly_those_actions(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url, user="ops-bo"))
    form = {"form_key": _key(client), "kind": "DASH_DEMO", "operation": "retry", "reason": "fixed"}
    before = _count(db)
    preview = client.post("/search/bulk", data=form)
    assert preview.status_code == 200, preview.text
    assert "run again: 3 actions would change" in preview.text
    previewed = _confirmed_ids(preview.text)
    assert sorted(int(i) for i in previewed.split(",")) == sorted(
        [*seeded.failed, seeded.cancelled]
    )
    assert _count(db) == before
    done = client.post("/search/bulk", data={**form, "ids": previewed})
    assert done.status_code == 200, done.text
    assert "run again: 3 actions changed" in done.text
    assert _count(db) == before + 3
    audit = db.rows(
        "SELECT action_id, actor, command, surface FROM {schema}.action_audit "
        "WHERE action_id = ANY(%s) ORDER BY action_id",
        ([*seeded.failed, seeded.cancelled],),
    )
    assert {row[1:] for row in audit} == {("ops-bo", "retry", "dashboard")} and len(audit) == 3


def test_a_confirmation_after_an_action_changed_changes_nothing(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    form = {"form_key": _key(client), "kind": "DASH_DEMO", "operation": "retry", "reason": "x"}
    previewed = _confirmed_ids(client.post("/search/bulk", data=form).text)
    # Meanwhile one of them is run again from its own page.
    first = seeded.failed[0]
    page = client.post(f"/action/{first}/retry", data={"form_key": form["form_key"], "reason": "y"})
    assert page.status_code == 200
    before = _count(db)
    late = client.post("/search/bulk", data={**form, "ids": previewed})
    assert late.status_code == 409
    assert "nothing was changed" in late.text and "run again already" in late.text
    assert _count(db) == before


def test_a_bulk_resolve_chooses_only_uncertain_actions(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    form = {
        "form_key": _key(client),
        "kind": "DASH_OTHER",
        "operation": "resolve-absent",
        "reason": "checked",
    }
    preview = client.post("/search/bulk", data=form)
    assert _confirmed_ids(preview.text) == str(seeded.uncertain)
    done = client.post("/search/bulk", data={**form, "ids": str(seeded.uncertain)})
    assert done.status_code == 200, done.text
    state = db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (seeded.uncertain,))
    assert state == "FAILED"


def test_the_bulk_forms_guards_change_nothing(db: OutboxTestDatabase, seeded: Seeded) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    key = _key(client)
    before = db.rows("SELECT id, state FROM {schema}.agent_action ORDER BY id")
    base = {"form_key": key, "kind": "DASH_DEMO", "operation": "retry", "reason": "x"}
    cases = [
        ({**base, "form_key": "guessed"}, 403, "stale or foreign form"),
        ({**base, "reason": " "}, 400, "a reason is required"),
        ({"form_key": key, "operation": "retry", "reason": "x"}, 400, "give the search a filter"),
        ({**base, "operation": "drop"}, 400, "no bulk change"),
        ({**base, "states": "DONE"}, 400, "acts on FAILED or CANCELLED actions only"),
        ({**base, "ids": "1,x"}, 400, "not a list of action ids"),
        ({**base, "kind": "nope"}, 400, "is not a kind"),
    ]
    for data, status, message in cases:
        response = client.post("/search/bulk", data=data)
        assert response.status_code == status, (data, response.text)
        assert message in response.text, (data, response.text)
    assert db.rows("SELECT id, state FROM {schema}.agent_action ORDER BY id") == before
