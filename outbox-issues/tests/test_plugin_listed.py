"""The first test of the plugin: ``outbox plugins`` lists outbox-issues and its four kinds."""

from __future__ import annotations

from typing import Any

from outbox_core.testing.plugin_listed import PluginListed

READ_BACK_WORKSPACE_KIND: dict[str, Any] = {
    "at_most_once": False,
    "instance_level": False,
    "variants": {"shape": "one"},
}


class TestOutboxIssuesIsListed(PluginListed):
    """Four read-back workspace kinds; the plugin module does not import httpx."""

    distribution = "outbox-issues"
    name = "issues"
    kinds = {
        kind: READ_BACK_WORKSPACE_KIND
        for kind in ("CLEANUP_ISSUE", "FILE_ISSUE", "PUBLISH_REPORT", "TRANSFER_ISSUE")
    }
    not_imported = ("httpx",)
