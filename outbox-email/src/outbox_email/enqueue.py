"""Enqueue an email in the application's transaction, after its notice agreed to send it.

The notice prepares the message first, in the enqueue itself (``EmailAdapter.check_enqueue``,
which every enqueue path runs: these functions, ``outbox_core.enqueue`` and
``enqueue_many``): an email that cannot be sent (nobody can receive it, an invalid address) is
refused there with a clear error, and nothing is written. The action's payload is
``{"notice": <name>, "event": {...}}``; the message is prepared again before every attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Required, TypedDict, Unpack

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel

from outbox_core import ActionRequest, Enqueued, InvalidRequest, Outbox, default_outbox
from outbox_core.steps import Steps, arun, run

from .adapter import BODY, KIND, TAG, EmailAdapter
from .notices import EmailNotice, NoticeRegistry


def _payload(
    outbox: Outbox,
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    idempotency_key: str,
) -> dict[str, Any]:
    """The payload of one email, once the notice is known and the event fits it (the notice
    prepares the message in the enqueue's check)."""
    entry = outbox.registry.get(KIND)
    adapter = entry.adapter
    if not issubclass(adapter, EmailAdapter):
        raise InvalidRequest(
            "kind", f"{KIND} is served by {adapter.__qualname__}, not EmailAdapter"
        )
    name = notice if isinstance(notice, str) else getattr(notice, "name", None)
    if not isinstance(name, str):
        raise InvalidRequest(
            "payload.notice", f"expected a notice name or an EmailNotice, got {notice!r}"
        )
    registered = (adapter.notices if adapter.notices is not None else NoticeRegistry()).get(name)
    if isinstance(event, BaseModel):
        if not isinstance(event, registered.event):
            raise InvalidRequest(
                "payload.event",
                f"the notice {name!r} takes a {registered.event.__qualname__}, got "
                f"{type(event).__qualname__}",
            )
        data: Any = event.model_dump(mode="json")
    else:
        data = dict(event)
    payload = {TAG: name, BODY: data}
    entry.variants.decode(payload, idempotency_key, kind=KIND)
    return payload


class EmailOptions(TypedDict, total=False):
    """The keyword arguments of every entry point below; only ``idempotency_key`` is required.

    ``lane_key`` defaults to ``email:<idempotency_key>`` (no order between emails); ``outbox``
    to the process's (``OUTBOX_*`` settings, notices from the installed plugins). The others
    are :class:`~outbox_core.ActionRequest`'s."""

    idempotency_key: Required[str]
    lane_key: str | None
    workspace_id: str | None
    subject_account_id: str | None
    max_attempts: int | None
    expires_at: datetime | None
    not_before: datetime | None
    outbox: Outbox | None


def _outbox(options: EmailOptions) -> Outbox:
    outbox = options.get("outbox")
    return outbox if outbox is not None else default_outbox()


def _request(payload: dict[str, Any], options: EmailOptions) -> ActionRequest:
    key = options["idempotency_key"]
    lane_key = options.get("lane_key")
    return ActionRequest(
        kind=KIND,
        lane_key=lane_key if lane_key is not None else f"email:{key}",
        idempotency_key=key,
        payload=payload,
        workspace_id=options.get("workspace_id"),
        subject_account_id=options.get("subject_account_id"),
        max_attempts=options.get("max_attempts"),
        expires_at=options.get("expires_at"),
        not_before=options.get("not_before"),
    )


# Each entry point is written once, as steps (outbox_core.steps): the request, then the enqueue,
# whose check runs the notice's prepare (sync) or aprepare (async). The public functions only
# run them.


def email_request(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> ActionRequest:
    """The :class:`~outbox_core.ActionRequest` of one email, for ``enqueue_many``: the notice is
    known and the event fits it. The notice prepares the message when the request is enqueued
    (by any path), in the enqueue's transaction. ``options``: see :class:`EmailOptions`.

    Raises :class:`~outbox_email.UnknownNotice` or :class:`~outbox_core.InvalidRequest`."""
    key = options["idempotency_key"]
    return _request(_payload(_outbox(options), notice, event, key), options)


def enqueue_email_steps(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> Steps[Enqueued]:
    """:func:`enqueue_email` as steps, to compose into an application's own operation."""
    request = email_request(notice, event, **options)
    return (yield from _outbox(options).enqueue_steps(request))


def enqueue_email(
    conn: Connection[Any],
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> Enqueued:
    """Enqueue one email in ``conn``'s transaction: it exists exactly when that commits.

    The notice prepares the message first (refusals raise, nothing is written). A second call
    with the same ``idempotency_key`` returns the first action. ``options``: see
    :class:`EmailOptions`."""
    return run(conn, enqueue_email_steps(notice, event, **options))


async def aenqueue_email(
    conn: AsyncConnection[Any],
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> Enqueued:
    """The async twin of :func:`enqueue_email`: the notice's ``aprepare`` runs."""
    return await arun(conn, enqueue_email_steps(notice, event, **options))
