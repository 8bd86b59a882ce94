"""The dashboard in a real browser (headless Chromium from the system's packages, driven by
Selenium with its driver manager off): each panel shows the right counts, a cancel works and a
cancel of a started action shows the refusal, an UNCERTAIN action is resolved from its page,
the page updates live, and the token is required when one is configured."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

from .conftest import TOKEN, Seeded, Served

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "dashboard.png"


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        f"none of {', '.join(names)} is installed: the dashboard's browser tests need Debian's "
        "chromium and chromium-driver (apt-get install -y chromium chromium-driver; .ci/run "
        "installs them)"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,1500")
    # The system's chromedriver, named: Selenium's driver manager would download one.
    service = Service(executable_path=_binary("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


# Read in one script each: the live refresh swaps the panels in at any moment, which would
# leave a found element stale before its text is read.
def text(browser: WebDriver, element_id: str) -> str:
    found = browser.execute_script(
        "var e = document.getElementById(arguments[0]); return e ? e.innerText : null;",
        element_id,
    )
    assert found is not None, f"no element #{element_id}"
    return str(found).strip()


def texts(browser: WebDriver, selector: str) -> list[str]:
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )
    return [str(item).strip() for item in found]


def wait_for(browser: WebDriver, what: str, condition: object) -> None:
    WebDriverWait(browser, 30).until(lambda _: condition(), message=what)  # type: ignore[operator]


def test_each_panel_shows_the_right_counts(
    browser: WebDriver, served: Served, seeded: Seeded
) -> None:
    browser.get(served.url)
    assert browser.title == "outbox dashboard"
    expected = {
        ("DASH_DEMO", "DONE"): 3,
        ("DASH_DEMO", "FAILED"): 2,
        ("DASH_DEMO", "CANCELLED"): 1,
        ("DASH_DEMO", "PROPOSED"): 1,
        ("DASH_DEMO", "EXECUTING"): 1,
        ("DASH_DEMO", "ADMITTED"): 1,
        ("DASH_OTHER", "UNCERTAIN"): 1,
        ("DASH_OTHER", "ADMITTED"): 2,
        ("DASH_OTHER", "DONE"): 0,
    }
    for (kind, state), count in expected.items():
        assert text(browser, f"count-{kind}-{state}") == str(count), (kind, state)
    assert text(browser, "total-DONE") == "3"
    assert f"action {seeded.admitted_due} " in text(browser, "oldest-due")
    # The lane keyed "blocked" waits for a head due in an hour: scheduled, not blocked.
    assert (text(browser, "blocked-count"), text(browser, "scheduled-count")) == ("0", "1")
    (lane,) = texts(browser, "tr.blocked-lane")
    assert lane.split()[:4] == ["blocked", str(seeded.waiting_head), "DASH_OTHER", "scheduled"]
    assert "head waits until" in lane
    (uncertain,) = texts(browser, "tr.uncertain-action")
    assert uncertain.split()[:3] == [str(seeded.uncertain), "DASH_OTHER", "unsure"]
    (failure,) = texts(browser, "tr.failure")
    assert failure.split()[:3] == ["DASH_DEMO", "REFUSED", "2"]
    # Ended this minute: 3 DONE, 2 FAILED, 1 UNCERTAIN, 1 CANCELLED.
    assert text(browser, "throughput-total") == "7"
    kinds = [row.split()[0] for row in texts(browser, "tr.kind")]
    assert {"DASH_DEMO", "DASH_OTHER"} <= set(kinds)
    wait_for(browser, "the live stream connects", lambda: text(browser, "live") == "live")
    if os.environ.get("OUTBOX_DASHBOARD_SCREENSHOT"):
        browser.save_screenshot(str(SCREENSHOT))


def test_a_cancel_works_and_a_cancel_of_a_started_action_shows_the_refusal(
    browser: WebDriver, served: Served, seeded: Seeded, db: OutboxTestDatabase
) -> None:
    browser.get(served.url)
    browser.find_element(By.ID, "cancel-id").send_keys(str(seeded.admitted_due))
    browser.find_element(By.ID, "cancel-submit").click()
    wait_for(browser, "the cancel's notice", lambda: browser.find_elements(By.ID, "notice"))
    assert text(browser, "notice") == (
        f"cancelled action {seeded.admitted_due} (DASH_DEMO in lane due)"
    )
    assert db.scalar(
        "SELECT state FROM {schema}.agent_action WHERE id = %s", (seeded.admitted_due,)
    ) == ("CANCELLED")
    assert text(browser, "count-DASH_DEMO-CANCELLED") == "2"

    browser.find_element(By.ID, "cancel-id").send_keys(str(seeded.executing))
    browser.find_element(By.ID, "cancel-submit").click()
    wait_for(browser, "the refusal", lambda: "EXECUTING" in text(browser, "notice"))
    assert text(browser, "notice") == (
        f"action {seeded.executing} is EXECUTING: only an action that has not started "
        "(PROPOSED or ADMITTED) can be cancelled"
    )
    assert "refused" in str(browser.find_element(By.ID, "notice").get_attribute("class"))
    assert db.scalar(
        "SELECT state FROM {schema}.agent_action WHERE id = %s", (seeded.executing,)
    ) == ("EXECUTING")


def test_the_page_follows_a_new_action_without_a_reload(
    browser: WebDriver, served: Served, db: OutboxTestDatabase
) -> None:
    browser.get(served.url)
    wait_for(browser, "the live stream connects", lambda: text(browser, "live") == "live")
    assert text(browser, "count-DASH_DEMO-ADMITTED") == "0"
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("DASH_DEMO", "new", "new"))
        conn.commit()
    wait_for(
        browser,
        "the new action appears",
        lambda: text(browser, "count-DASH_DEMO-ADMITTED") == "1",
    )


def test_a_run_now_carries_out_a_due_head(
    browser: WebDriver, served: Served, seeded: Seeded, db: OutboxTestDatabase
) -> None:
    browser.get(served.url)
    browser.find_element(By.ID, "run-now-id").send_keys(str(seeded.admitted_due))
    browser.find_element(By.ID, "run-now-submit").click()
    wait_for(browser, "the run's notice", lambda: browser.find_elements(By.ID, "notice"))
    assert text(browser, "notice") == f"ran action {seeded.admitted_due} (DASH_DEMO): now DONE"
    assert text(browser, "count-DASH_DEMO-DONE") == "4"


def test_the_token_is_required_when_configured(
    browser: WebDriver, served_with_token: Served, seeded: Seeded
) -> None:
    browser.delete_all_cookies()
    browser.get(served_with_token.url)
    assert "needs its token" in texts(browser, "body")[0]
    assert not browser.find_elements(By.ID, "panels")
    browser.get(served_with_token.url + "?token=wrong-token-wrong-token")
    assert "needs its token" in texts(browser, "body")[0]
    browser.get(served_with_token.url + f"?token={TOKEN}")
    assert text(browser, "count-DASH_DEMO-DONE") == "3"
    # The cookie carries it from there: the form and the live panels.
    browser.get(served_with_token.url)
    assert text(browser, "count-DASH_DEMO-DONE") == "3"
    browser.find_element(By.ID, "cancel-id").send_keys(str(seeded.proposed))
    browser.find_element(By.ID, "cancel-submit").click()
    wait_for(browser, "the cancel's notice", lambda: browser.find_elements(By.ID, "notice"))
    assert text(browser, "notice").startswith(f"cancelled action {seeded.proposed} ")
    wait_for(browser, "the live stream connects", lambda: text(browser, "live") == "live")
    browser.delete_all_cookies()


def test_at_1400_px_the_since_and_ended_columns_are_not_clipped(
    browser: WebDriver, served: Served, db: OutboxTestDatabase
) -> None:
    """Long lane keys (an application's own strings) wrap; the times beside them stay whole
    and inside their panel."""
    from datetime import timedelta

    from .conftest import Demo

    lane = "tenant-4711/" + "customer-" * 14
    later = db.scalar("SELECT now()") + timedelta(hours=1)
    with db.connect() as conn:
        db.outbox.enqueue(
            conn, ActionRequest("DASH_OTHER", lane, "unsure", Demo(outcome="uncertain"))
        )
        conn.commit()
    db.drain()
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("DASH_DEMO", lane, "head", not_before=later))
        db.outbox.enqueue(conn, ActionRequest("DASH_DEMO", lane, "behind"))
        conn.commit()
    browser.set_window_size(1400, 1500)
    try:
        browser.get(served.url)
        for panel, row in (("blocked", "tr.blocked-lane"), ("uncertain", "tr.uncertain-action")):
            overflow, sticking_out, shown = browser.execute_script(
                "var p = document.getElementById(arguments[0]);"
                "var c = p.querySelector(arguments[1] + ' td:last-child');"
                "return [p.scrollWidth - p.clientWidth,"
                " c.getBoundingClientRect().right - p.getBoundingClientRect().right,"
                " c.innerText];",
                panel,
                row,
            )
            assert overflow <= 0 and sticking_out <= 0.5, (panel, overflow, sticking_out)
            assert len(shown.strip()) == len("2026-12-02 14:44:23"), (panel, shown)
    finally:
        browser.set_window_size(1280, 1500)


def test_an_uncertain_action_is_resolved_not_done_from_its_page(
    browser: WebDriver, served: Served, seeded: Seeded, db: OutboxTestDatabase
) -> None:
    browser.get(f"{served.url}action/{seeded.uncertain}")
    form = browser.find_element(By.ID, "resolve-absent")
    form.find_element(By.NAME, "reason").send_keys("not in the provider's log")
    form.find_element(By.TAG_NAME, "button").click()
    wait_for(browser, "the resolution's notice", lambda: browser.find_elements(By.ID, "notice"))
    assert "refused" not in str(browser.find_element(By.ID, "notice").get_attribute("class"))
    assert db.scalar(
        "SELECT state || ' ' || stop_reason FROM {schema}.agent_action WHERE id = %s",
        (seeded.uncertain,),
    ) == ("FAILED RESOLVED_ABSENT")
    assert db.scalar(
        "SELECT surface || '/' || reason FROM {schema}.action_audit WHERE action_id = %s",
        (seeded.uncertain,),
    ) == ("dashboard/not in the provider's log")
    # The action is no longer UNCERTAIN: its page offers no resolution, and a retry instead.
    assert not browser.find_elements(By.ID, "resolve-absent")
    assert browser.find_elements(By.ID, "retry")


def test_every_failed_match_of_a_search_is_run_again_after_its_preview(
    browser: WebDriver, served: Served, seeded: Seeded, db: OutboxTestDatabase
) -> None:
    browser.get(f"{served.url}search?kind=DASH_DEMO&states=FAILED")
    browser.find_element(By.ID, "bulk-reason").send_keys("the relay is fixed")
    browser.find_element(By.ID, "bulk-preview").click()
    wait_for(browser, "the preview", lambda: browser.find_elements(By.ID, "bulk-confirm"))
    assert "2 actions would change" in text(browser, "notice")
    before = db.scalar("SELECT count(*) FROM {schema}.agent_action")
    browser.find_element(By.ID, "bulk-confirm-submit").click()
    wait_for(browser, "the change", lambda: "changed" in text(browser, "notice"))
    assert "run again: 2 actions changed" in text(browser, "notice")
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == before + 2
    keys = {row[0] for row in db.rows("SELECT idempotency_key FROM {schema}.agent_action")}
    assert {"fail-0#retry-1", "fail-1#retry-1"} <= keys
