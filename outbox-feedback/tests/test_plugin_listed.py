"""The first test of the plugin: ``outbox plugins`` lists outbox-feedback and its kinds."""

from __future__ import annotations

import json
import subprocess
import sys

from outbox_core.plugins import build_host
from outbox_core.testing import OutboxTestDatabase

KINDS = ["DELIVER_FEEDBACK", "EDIT_FEEDBACK", "RETRACT_FEEDBACK"]


def test_the_plugin_host_lists_outbox_feedback_with_three_read_back_kinds_chosen_by_key_suffix() -> (
    None
):
    plugins = {entry["distribution"]: entry for entry in build_host().describe()}

    feedback = plugins["outbox-feedback"]
    assert feedback["name"] == "feedback"
    assert feedback["module"] == "outbox_feedback.plugin"
    assert feedback["migration_lines"] == ["feedback"]
    assert sorted(kind["kind"] for kind in feedback["kinds"]) == KINDS
    for kind in feedback["kinds"]:
        assert kind["at_most_once"] is False
        assert kind["instance_level"] is False
        assert kind["variants"]["shape"] == "key_suffix"
        assert kind["variants"]["suffixes"] == ["review"]


def test_the_outbox_plugins_command_lists_outbox_feedback() -> None:
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
    feedback = next(entry for entry in entries if entry["distribution"] == "outbox-feedback")
    assert sorted(kind["kind"] for kind in feedback["kinds"]) == KINDS


def test_the_plugin_module_does_not_import_httpx() -> None:
    code = "import sys, outbox_feedback.plugin; sys.exit(1 if 'httpx' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0


def test_the_kinds_are_registered_in_the_database_as_read_back_workspace_kinds(
    outbox_db: OutboxTestDatabase,
) -> None:
    rows = outbox_db.rows(
        "SELECT kind, at_most_once, instance_level, line FROM {schema}.action_kind "
        "WHERE line = 'feedback' ORDER BY kind"
    )
    assert rows == [(kind, False, False, "feedback") for kind in KINDS]
