"""Enqueue from where applications already write: an ORM's own transaction.

- :mod:`outbox_core.integrations.sqlalchemy` -- a SQLAlchemy ``Session`` or ``AsyncSession``
  on psycopg 3 (extra ``outbox-core[sqlalchemy]``).
- :mod:`outbox_core.integrations.django` -- Django's connection inside ``transaction.atomic()``
  (extra ``outbox-core[django]``).

Each runs the core's own enqueue on the ORM's database connection, in its open transaction, so
the action commits or rolls back with the ORM's changes. Neither ORM is imported until its
module is. ``docs/integrations.md`` shows both.
"""

from __future__ import annotations

from ..errors import ConfigurationError, OutboxError

__all__ = ["NotInTransaction", "UnsupportedDriver"]


class UnsupportedDriver(ConfigurationError):
    """The ORM's connection is not a psycopg 3 connection to PostgreSQL: the outbox runs its
    statements on that very connection, so it needs that driver (``postgresql+psycopg://``)."""


class NotInTransaction(OutboxError):
    """The ORM has no transaction open, so the action would commit on its own, apart from the
    change that asked for it."""
