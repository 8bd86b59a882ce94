"""The first test of the plugin: ``outbox plugins`` lists outbox-draft and its DRAFT_REPORT."""

from __future__ import annotations

import json
import subprocess
import sys

from outbox_core.plugins import build_host
from outbox_core.testing import OutboxTestDatabase


def test_the_plugin_host_lists_outbox_draft_with_draft_report_and_its_line() -> None:
    plugins = {entry["distribution"]: entry for entry in build_host().describe()}

    draft = plugins["outbox-draft"]
    assert draft["name"] == "draft"
    assert draft["module"] == "outbox_draft.plugin"
    assert draft["migration_lines"] == ["draft"]
    [kind] = draft["kinds"]
    assert kind["kind"] == "DRAFT_REPORT"
    assert kind["adapter"] == "outbox_draft.adapter.DraftReportAdapter"
    assert kind["at_most_once"] is False
    assert kind["instance_level"] is False
    assert kind["variants"]["shape"] == "one"


def test_the_outbox_plugins_command_lists_outbox_draft() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "plugins"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    entries = listed if isinstance(listed, list) else listed.get("plugins", [])
    draft = next(entry for entry in entries if entry["distribution"] == "outbox-draft")
    assert [kind["kind"] for kind in draft["kinds"]] == ["DRAFT_REPORT"]


def test_the_plugin_module_does_not_import_httpx() -> None:
    code = "import sys, outbox_draft.plugin; sys.exit(1 if 'httpx' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0


def test_the_kind_is_registered_in_the_database_as_a_workspace_kind_that_reads_nothing_back(
    outbox_db: OutboxTestDatabase,
) -> None:
    rows = outbox_db.rows(
        "SELECT kind, at_most_once, instance_level, line FROM {schema}.action_kind "
        "WHERE line = 'draft'"
    )
    assert rows == [("DRAFT_REPORT", False, False, "draft")]
