"""The first test of the plugin: ``outbox plugins`` lists outbox-email and its EMAIL kind."""

from __future__ import annotations

import json
import subprocess
import sys

from outbox_core.plugins import build_host


def test_the_plugin_host_lists_outbox_email_with_the_email_kind_and_its_migration_line() -> None:
    plugins = {entry["distribution"]: entry for entry in build_host().describe()}

    email = plugins["outbox-email"]
    assert email["name"] == "email"
    assert email["module"] == "outbox_email.plugin"
    assert email["migration_lines"] == ["email"]
    [kind] = email["kinds"]
    assert kind["kind"] == "EMAIL"
    assert kind["adapter"] == "outbox_email.adapter.EmailAdapter"
    assert kind["at_most_once"] is True
    assert kind["instance_level"] is True
    assert kind["variants"]["shape"] == "tagged"
    assert (kind["variants"]["tag"], kind["variants"]["body"]) == ("notice", "event")


def test_the_outbox_plugins_command_lists_outbox_email_and_email() -> None:
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
    email = next(entry for entry in entries if entry["distribution"] == "outbox-email")
    assert [kind["kind"] for kind in email["kinds"]] == ["EMAIL"]
