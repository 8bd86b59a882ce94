"""The first test of the plugin: ``outbox plugins`` lists outbox-issues and its four kinds."""

from __future__ import annotations

import json
import subprocess
import sys

from outbox_core.plugins import build_host

KINDS = ["CLEANUP_ISSUE", "FILE_ISSUE", "PUBLISH_REPORT", "TRANSFER_ISSUE"]


def test_the_plugin_host_lists_outbox_issues_with_four_read_back_kinds_and_its_line() -> None:
    plugins = {entry["distribution"]: entry for entry in build_host().describe()}

    issues = plugins["outbox-issues"]
    assert issues["name"] == "issues"
    assert issues["module"] == "outbox_issues.plugin"
    assert issues["migration_lines"] == ["issues"]
    assert sorted(kind["kind"] for kind in issues["kinds"]) == KINDS
    for kind in issues["kinds"]:
        assert kind["at_most_once"] is False
        assert kind["instance_level"] is False
        assert kind["variants"]["shape"] == "one"


def test_the_outbox_plugins_command_lists_outbox_issues() -> None:
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
    issues = next(entry for entry in entries if entry["distribution"] == "outbox-issues")
    assert sorted(kind["kind"] for kind in issues["kinds"]) == KINDS


def test_the_plugin_module_does_not_import_httpx() -> None:
    code = "import sys, outbox_issues.plugin; sys.exit(1 if 'httpx' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0


def test_the_kinds_are_registered_in_the_database_as_read_back_workspace_kinds(
    outbox_db,  # type: ignore[no-untyped-def]
) -> None:
    rows = outbox_db.rows(
        "SELECT kind, at_most_once, instance_level, line FROM {schema}.action_kind "
        "WHERE line = 'issues' ORDER BY kind"
    )
    assert rows == [(kind, False, False, "issues") for kind in KINDS]
