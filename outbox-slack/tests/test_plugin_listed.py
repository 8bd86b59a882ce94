"""The first test of the plugin: ``outbox plugins`` lists outbox-slack and its SLACK_POST kind."""

from __future__ import annotations

from outbox_core.testing.plugin_listed import PluginListed


class TestOutboxSlackIsListed(PluginListed):
    """A workspace kind, not retained; neither the plugin module nor ``outbox plugins`` imports
    slack_sdk or aiohttp."""

    distribution = "outbox-slack"
    name = "slack"
    kinds = {
        "SLACK_POST": {
            "adapter": "outbox_slack.adapter.SlackPostAdapter",
            "at_most_once": False,
            "instance_level": False,
            "retained": False,
            "variants": {"shape": "one"},
        }
    }
    not_imported = ("slack_sdk", "aiohttp")
