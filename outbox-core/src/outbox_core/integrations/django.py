"""Enqueue on Django's database connection, inside ``transaction.atomic()`` (extra
``outbox-core[django]``).

::

    from django.db import transaction
    from outbox_core import ActionRequest
    from outbox_core.integrations.django import enqueue

    with transaction.atomic():
        order.save()
        enqueue(ActionRequest("EMAIL", f"order:{order.pk}", f"confirm:{order.pk}"))

The database alias (``using``) must use Django's PostgreSQL backend on psycopg 3 (Django 4.2
and later pick psycopg 3 when it is installed). The call is refused with
:class:`~outbox_core.integrations.NotInTransaction` outside an atomic block: in Django's
autocommit the action would commit at once, on its own, apart from the change that asked for
it. The outbox's tables stay the outbox's: ``outbox migrate`` applies them, beside
``manage.py migrate`` (``docs/integrations.md``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

from ..outbox import Outbox, default_outbox
from ..requests import ActionRequest, Enqueued
from . import NotInTransaction, UnsupportedDriver

__all__ = ["enqueue"]


def enqueue(
    request: ActionRequest, using: str = "default", *, outbox: Outbox | None = None
) -> Enqueued:
    """Enqueue ``request`` on the connection of database alias ``using``, in the atomic block
    open on it: the action commits or rolls back with that block (a savepoint of a nested
    block included). ``outbox`` defaults to :func:`~outbox_core.default_outbox`."""
    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise UnsupportedDriver(
            f"database {using!r} uses Django's {wrapper.vendor} backend; the outbox enqueues on "
            "Django's own connection and needs PostgreSQL (django.db.backends.postgresql) on "
            "psycopg 3"
        )
    if not wrapper.in_atomic_block:
        raise NotInTransaction(
            f"enqueue on database {using!r} outside transaction.atomic(): the action would "
            "commit on its own, apart from the change that asked for it; call it inside "
            f"`with transaction.atomic(using={using!r}):`"
        )
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise UnsupportedDriver(
            f"database {using!r} runs on {type(raw).__module__} (psycopg2?); the outbox needs "
            "psycopg 3: install psycopg and Django picks it"
        )
    conn: psycopg.Connection[Any] = raw
    return (outbox or default_outbox()).enqueue(conn, request)
