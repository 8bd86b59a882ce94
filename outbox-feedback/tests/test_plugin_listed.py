"""The first test of the plugin: ``outbox plugins`` lists outbox-feedback and its kinds."""

from __future__ import annotations

from typing import Any

from outbox_core.testing.plugin_listed import PluginListed

CHOSEN_BY_KEY_SUFFIX: dict[str, Any] = {
    "at_most_once": False,
    "instance_level": False,
    "variants": {"shape": "key_suffix", "suffixes": ["review"]},
}


class TestOutboxFeedbackIsListed(PluginListed):
    """Three read-back workspace kinds chosen by key suffix; the plugin module does not import
    httpx."""

    distribution = "outbox-feedback"
    name = "feedback"
    kinds = {
        kind: CHOSEN_BY_KEY_SUFFIX
        for kind in ("DELIVER_FEEDBACK", "EDIT_FEEDBACK", "RETRACT_FEEDBACK")
    }
    not_imported = ("httpx",)
