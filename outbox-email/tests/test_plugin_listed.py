"""The first test of the plugin: ``outbox plugins`` lists outbox-email and its EMAIL kind."""

from __future__ import annotations

from outbox_core.testing.plugin_listed import PluginListed


class TestOutboxEmailIsListed(PluginListed):
    """An at-most-once, instance-level kind tagged by notice, its body the event."""

    distribution = "outbox-email"
    name = "email"
    kinds = {
        "EMAIL": {
            "adapter": "outbox_email.adapter.EmailAdapter",
            "at_most_once": True,
            "instance_level": True,
            "variants": {"shape": "tagged", "tag": "notice", "body": "event"},
        }
    }
