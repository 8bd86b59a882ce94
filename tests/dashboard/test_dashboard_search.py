"""The dashboard's search of actions (outbox_core.search), over plain HTTP: the form finds what
the filter names, every id links to its action's page, the next page is a link, a wrong value
is a notice naming the field, and the token guards both pages."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import TOKEN, Seeded

ROW_ID = re.compile(r'<a href="[^"]*/action/(\d+)">\1</a>')


def test_the_search_finds_what_the_filter_names_and_links_each_id_to_its_page(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    found = client.get("/search", params={"states": "FAILED,UNCERTAIN", "kind": ""})
    assert found.status_code == 200, found.text
    ids = [int(match) for match in ROW_ID.findall(found.text)]
    assert ids == sorted([*seeded.failed, seeded.uncertain], reverse=True)
    page = client.get(f"/action/{seeded.uncertain}")
    assert page.status_code == 200
    assert "UNCERTAIN" in page.text and "DASH_OTHER" in page.text
    assert client.get("/action/999999").status_code == 404


def test_the_search_pages_through_every_match_with_its_next_page_link(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    response = client.get("/search", params={"kind": "DASH_DEMO", "limit": "2"})
    seen: list[int] = []
    for _ in range(10):
        assert response.status_code == 200, response.text
        seen.extend(int(match) for match in ROW_ID.findall(response.text))
        link = re.search(r'id="next-page" href="([^"]+)"', response.text)
        if link is None:
            break
        response = client.get(link.group(1).replace("&amp;", "&"))
    expected = [*seeded.done, *seeded.failed, seeded.cancelled, seeded.proposed]
    expected += [seeded.executing, seeded.admitted_due]
    assert seen == sorted(expected, reverse=True)


def test_a_wrong_search_value_is_a_notice_naming_the_field(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url))
    response = client.get("/search", params={"states": "DONEE"})
    assert response.status_code == 400
    assert "states: &#39;DONEE&#39; is not a state" in response.text
    response = client.get("/search", params={"created_since": "yesterday"})
    assert response.status_code == 400 and "created_since: " in response.text


def test_the_search_and_an_actions_page_need_the_token(
    db: OutboxTestDatabase, seeded: Seeded
) -> None:
    client = TestClient(create_app(db.outbox, db.url, token=TOKEN))
    assert client.get("/search").status_code == 401
    assert client.get(f"/action/{seeded.uncertain}").status_code == 401
    assert client.get("/search", params={"token": TOKEN}).status_code == 200
