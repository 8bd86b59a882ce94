"""Every error the core raises on purpose. Each message says what was wrong and what to do."""

from __future__ import annotations


class OutboxError(Exception):
    """Base of all errors raised by outbox on purpose."""


class ConfigurationError(OutboxError):
    """A setting is missing or malformed."""


class UnknownKind(OutboxError):
    """No installed plugin registers this kind."""


class InvalidRequest(OutboxError, ValueError):
    """An enqueue was refused before anything was written. ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidFilter(OutboxError, ValueError):
    """A search of actions (:mod:`outbox_core.search`) was refused before it ran: a filter
    field, the page size or the cursor is wrong. ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class IdempotencyConflict(InvalidRequest):
    """An idempotency key was reused for a different effect (another kind or lane)."""


class RegistrationError(OutboxError):
    """A plugin registered something the host refuses (a duplicate kind, no variants())."""


class PluginLoadError(OutboxError):
    """A plugin failed to load; the message names its distribution and version."""


class MigrationError(OutboxError):
    """A migration could not be applied, or an applied one was changed afterwards."""


class UndecodableAction(OutboxError):
    """A decoding read met a row of a kind or variant this build does not know."""


class EgressViolation(OutboxError):
    """An adapter's ``execute`` was called from outside the executor."""


class AdapterContractError(OutboxError, TypeError):
    """An adapter broke its contract: ``execute`` returned something that is not a well-formed
    ``AdapterResult`` (a missing ``return``), or a callback or attribute has the wrong type.
    The executor ends such an attempt as if it raised; ``drain()`` raises this in tests."""


class PreparedStatementsLost(ConfigurationError):
    """A statement on the caller's connection failed because the server session no longer
    holds the prepared statement psycopg made on it: the connection goes through a pooler in
    transaction mode that does not keep prepared statements (PgBouncer before 1.21)."""
