"""The first test of the plugin: ``outbox plugins`` lists outbox-draft and its DRAFT_REPORT."""

from __future__ import annotations

from outbox_core.testing.plugin_listed import PluginListed


class TestOutboxDraftIsListed(PluginListed):
    """A workspace kind that reads nothing back; the plugin module does not import httpx."""

    distribution = "outbox-draft"
    name = "draft"
    kinds = {
        "DRAFT_REPORT": {
            "adapter": "outbox_draft.adapter.DraftReportAdapter",
            "at_most_once": False,
            "instance_level": False,
            "variants": {"shape": "one"},
        }
    }
    not_imported = ("httpx",)
