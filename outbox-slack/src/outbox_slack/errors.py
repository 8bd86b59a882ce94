"""The errors outbox-slack raises to the application."""

from __future__ import annotations

from outbox_core import InvalidRequest, OutboxError


class TurnAlreadyPosted(InvalidRequest):
    """The turn's entries are stored and its post was removed (its entries were redacted, or
    its subject erased): posting it again would repeat a removed post."""


class UnknownEntry(OutboxError):
    """No stored entry has this id."""
