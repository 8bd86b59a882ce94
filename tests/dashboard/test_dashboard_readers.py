"""The dashboard reads what `outbox status` reads (issue 31 item 8): one definition of due for
the oldest due action, a lane whose head is due later is "scheduled", not "blocked", and the
variants read as JSON, not escaped."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from typing import Any

from starlette.testclient import TestClient

from outbox_core import ActionRequest, collect_status
from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import Demo


def _enqueue(db: OutboxTestDatabase, request: ActionRequest) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, request).id
        conn.commit()
    return action_id


def _status(db: OutboxTestDatabase) -> dict[str, Any]:
    """What `outbox status --json` prints, for this test's kinds."""
    with db.connect() as conn:
        return collect_status(conn, db.outbox).as_dict()


def _oldest_due(page: str) -> str:
    found = re.search(r'<p id="oldest-due"[^>]*>(.*?)</p>', page, re.S)
    assert found is not None
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_an_action_behind_a_head_scheduled_later_is_not_due_on_the_dashboard_as_in_status(
    db: OutboxTestDatabase,
) -> None:
    later = db.scalar("SELECT now()") + timedelta(hours=1)
    _enqueue(db, ActionRequest("DASH_DEMO", "lane", "head", not_before=later))
    _enqueue(db, ActionRequest("DASH_DEMO", "lane", "behind"))
    client = TestClient(create_app(db.outbox, db.url))

    assert _oldest_due(client.get("/panels").text) == "nothing is due"
    status = _status(db)
    assert status["oldest_due"] is None
    assert {kind["kind"]: kind["due"] for kind in status["kinds"]}["DASH_DEMO"] == 0

    due = _enqueue(db, ActionRequest("DASH_DEMO", "other", "due"))
    shown = _oldest_due(client.get("/panels").text)
    assert shown.startswith(f"action {due} (DASH_DEMO in lane other), due ")
    assert _status(db)["oldest_due"]["id"] == due


def test_a_lane_whose_head_is_due_later_is_scheduled_and_one_held_by_a_proposal_is_blocked(
    db: OutboxTestDatabase,
) -> None:
    later = db.scalar("SELECT now()") + timedelta(hours=1)
    scheduled = _enqueue(db, ActionRequest("DASH_DEMO", "later", "later-head", not_before=later))
    _enqueue(db, ActionRequest("DASH_DEMO", "later", "later-behind"))
    proposal = _enqueue(db, ActionRequest("DASH_DEMO", "asked", "asked-head", proposed=True))
    _enqueue(db, ActionRequest("DASH_DEMO", "asked", "asked-behind"))

    page = TestClient(create_app(db.outbox, db.url)).get("/panels").text

    rows = {
        int(cells[1]): cells[3]
        for row in re.findall(r'<tr class="blocked-lane">(.*?)</tr>', page, re.S)
        for cells in [
            [
                re.sub(r"<[^>]+>", "", cell).strip()
                for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
            ]
        ]
    }
    assert rows == {scheduled: "scheduled", proposal: "blocked"}
    assert re.search(r'id="blocked-count">1<', page) and re.search(r'id="scheduled-count">1<', page)


def test_the_variants_read_as_json_and_the_json_path_as_written(db: OutboxTestDatabase) -> None:
    _enqueue(db, ActionRequest("DASH_DEMO", "lane", "k", Demo(outcome="done")))
    page = TestClient(create_app(db.outbox, db.url)).get("/").text

    row = re.search(r'<tr class="kind"><td>DASH_DEMO</td>(.*?)</tr>', page, re.S)
    assert row is not None
    pre = re.search(r'<pre class="variants">(.*?)</pre>', row.group(1), re.S)
    assert pre is not None
    variants = json.loads(html.unescape(pre.group(1)))
    assert variants["shape"] == "one" and variants["model"] == "Demo"
    path = re.search(r'<p class="json-path">JSON path: <code>(.*?)</code>', row.group(1), re.S)
    assert path is not None
    written = html.unescape(path.group(1))
    assert '$."outcome"' in written and "\\" not in written
