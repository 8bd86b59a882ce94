"""Fixtures and helpers of outbox-issues' tests.

The results tables (``TABLE`` in test_file_issue.py, ``PUBLISH`` and ``TRANSFER`` in
test_publish_transfer.py, ``CLEANUP`` in test_erasure.py) are plain data, so the core's adapter
conformance suite, once it lands, can be subclassed here and fed from them. The loopback
tracker has the switches such a suite needs: fail before recording a write (``fail``,
``drop``, ``stall``), record then drop (``drop(after_recording=True)``), stall after recording
(``stall(after_recording=True)``), hold a write (``hold``/``release``), and count the writes
per action marker (``writes_for``).
"""

from __future__ import annotations

from typing import Any

import pytest

from outbox_core import ActionState
from outbox_core.plugins import PluginHost, build_host
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.plugin_listed import plugin_listed_first
from outbox_issues import Filing, get_filing, submit_report
from outbox_issues.testing import GitHubTestServer, serve_issues

from . import draft_plugin

REPORTER = "acct-ada"
TEXT = "The export button does nothing when the list is empty. I am Ada, ada@example.com."


pytest_collection_modifyitems = plugin_listed_first
"""The plugin's first test runs first: `outbox plugins` lists it and its kinds."""


@pytest.fixture(scope="session")
def outbox_plugin_host() -> PluginHost:
    """The installed plugins plus a stand-in for outbox-draft (its hook answers only in the
    tests that enable it)."""
    return build_host(extra_plugins=[("issues-tests", draft_plugin)])


@pytest.fixture(autouse=True)
def no_draft() -> None:
    draft_plugin.ENABLED = False
    draft_plugin.LANE = None
    draft_plugin.DraftAdapter.calls = []


@pytest.fixture
def issues_db(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> OutboxTestDatabase:
    """A fresh database whose issue kinds talk to the loopback tracker. A listing may prove a
    write absent at once (listing_lag_seconds=0) unless a test says otherwise."""
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=0.0)
    return outbox_db


def submit(db: OutboxTestDatabase, report: str = "r1", **options: Any) -> Any:
    values: dict[str, Any] = {
        "workspace_id": "ws-1",
        "reporter_account_id": REPORTER,
        "title": "Export does nothing",
        "text": TEXT,
    }
    values.update(options)
    with db.connect() as conn:
        return submit_report(conn, report_id=report, outbox=db.outbox, **values)


def action(db: OutboxTestDatabase, key: str) -> tuple[ActionState, str | None, int]:
    """(state, stop reason, attempts counted) of the action holding ``key``."""
    found = db.action_state(key)
    assert found is not None, f"no action holds {key}"
    return found


def filing(db: OutboxTestDatabase, report: str = "r1") -> Filing:
    with db.connect() as conn:
        found = get_filing(conn, report, outbox=db.outbox)
    assert found is not None
    return found
