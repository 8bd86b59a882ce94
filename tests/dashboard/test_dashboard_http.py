"""The dashboard's guards, over plain HTTP: a form from elsewhere is refused, no payload is ever
on a page, and `outbox dashboard` will not listen beyond this machine without a token."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from outbox_core import ActionRequest
from outbox_core.cli import main
from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import TOKEN, Seeded

CANARY = "canary-payload-5d1e"


def test_a_form_without_this_dashboards_key_changes_nothing(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    response = client.post(
        "/actions/cancel", data={"form_key": "guessed", "action_id": str(seeded.admitted_due)}
    )
    assert response.status_code == 403
    state = db.scalar(
        "SELECT state FROM {schema}.agent_action WHERE id = %s", (seeded.admitted_due,)
    )
    assert state == "ADMITTED"


def test_no_payload_value_is_ever_on_a_page(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        for key in ("due", "uncertain"):
            db.outbox.enqueue(
                conn,
                ActionRequest("DASH_DEMO", "lane", key, {"outcome": "done", "note": CANARY}),
            )
        conn.commit()
    assert (
        db.scalar(
            "SELECT count(*) FROM {schema}.agent_action WHERE payload::text LIKE %s",
            (f"%{CANARY}%",),
        )
        == 2
    )
    client = TestClient(create_app(db.outbox, db.url))
    first = db.scalar("SELECT min(id) FROM {schema}.agent_action")
    for path in ("/", "/panels", "/search", f"/action/{first}"):
        page = client.get(path)
        assert page.status_code == 200 and "DASH_DEMO" in page.text
        assert CANARY not in page.text


def test_every_request_needs_the_token_when_one_is_configured(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url, token=TOKEN))
    for path in ("/", "/panels", "/events"):
        assert client.get(path).status_code == 401
    assert client.post("/actions/cancel", data={"action_id": "1"}).status_code == 401
    assert client.get("/panels", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    page = client.get(f"/?token={TOKEN}")
    assert page.status_code == 200
    key = re.search(r'name="form_key" value="([^"]+)"', page.text)
    assert key is not None
    # The cookie that the first visit set carries the token from there.
    response = client.post(
        "/actions/cancel",
        data={"form_key": key.group(1), "action_id": str(seeded.proposed), "reason": "dup"},
    )
    assert response.status_code == 200 and f"cancelled action {seeded.proposed}" in response.text
    audit = db.rows(
        "SELECT actor, command, reason, surface, after_state FROM {schema}.action_audit "
        "WHERE action_id = %s",
        (seeded.proposed,),
    )
    assert audit == [("dashboard", "cancel", "dup", "dashboard", "CANCELLED")]


def test_the_dashboard_will_not_listen_beyond_this_machine_without_a_token(
    db: OutboxTestDatabase,
) -> None:
    result = CliRunner().invoke(
        main,
        ["dashboard", "--host", "0.0.0.0"],
        env={"OUTBOX_DATABASE_URL": db.url, "OUTBOX_DASHBOARD_TOKEN": ""},
    )
    assert result.exit_code == 2
    assert "needs a token; set OUTBOX_DASHBOARD_TOKEN" in result.output
    short = CliRunner().invoke(
        main, ["dashboard"], env={"OUTBOX_DATABASE_URL": db.url, "OUTBOX_DASHBOARD_TOKEN": "x"}
    )
    assert short.exit_code == 2 and "at least 16 characters" in short.output


def test_outbox_dashboard_user_is_the_actor_of_its_audit_rows(
    db: OutboxTestDatabase, seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    env = {"OUTBOX_DATABASE_URL": db.url, "OUTBOX_SCHEMA": db.schema, "OUTBOX_DASHBOARD_TOKEN": ""}
    blank = CliRunner().invoke(main, ["dashboard", "--user", " "], env=env)
    assert blank.exit_code == 2 and "--user: give a name" in blank.output and not served
    result = CliRunner().invoke(main, ["dashboard", "--user", "ana"], env=env)
    assert result.exit_code == 0, result.output
    client = TestClient(served[0])
    key = re.search(r'name="form_key" value="([^"]+)"', client.get("/").text)
    assert key is not None
    response = client.post(
        "/actions/cancel", data={"form_key": key.group(1), "action_id": str(seeded.proposed)}
    )
    assert response.status_code == 200, response.text
    audit = db.rows(
        "SELECT actor, reason FROM {schema}.action_audit WHERE action_id = %s", (seeded.proposed,)
    )
    assert audit == [("ana", "no reason given")]
