"""The first test of the plugin: ``outbox plugins`` lists outbox-slack and its SLACK_POST kind."""

from __future__ import annotations

import json
import subprocess
import sys

from outbox_core.plugins import build_host


def test_the_plugin_host_lists_outbox_slack_with_the_slack_post_kind_and_its_line() -> None:
    plugins = {entry["distribution"]: entry for entry in build_host().describe()}

    slack = plugins["outbox-slack"]
    assert slack["name"] == "slack"
    assert slack["module"] == "outbox_slack.plugin"
    assert slack["migration_lines"] == ["slack"]
    [kind] = slack["kinds"]
    assert kind["kind"] == "SLACK_POST"
    assert kind["adapter"] == "outbox_slack.adapter.SlackPostAdapter"
    assert kind["at_most_once"] is False
    assert kind["instance_level"] is False
    assert kind["retained"] is False
    assert kind["variants"]["shape"] == "one"


def test_the_outbox_plugins_command_lists_slack_post_without_importing_slack_sdk() -> None:
    probe = (
        "import sys, runpy; sys.argv = ['outbox', 'plugins'];"
        "import outbox_core.cli as cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('IMPORTED' if any(m.startswith(('slack_sdk', 'aiohttp')) for m in sys.modules)"
        " else 'LIGHT', file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    listed = json.loads(done.stdout)
    entries = listed if isinstance(listed, list) else listed.get("plugins", [])
    slack = next(entry for entry in entries if entry["distribution"] == "outbox-slack")
    assert [kind["kind"] for kind in slack["kinds"]] == ["SLACK_POST"]
    assert done.stderr.strip().endswith("LIGHT"), done.stderr
