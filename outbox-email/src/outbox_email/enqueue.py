"""Enqueue an email in the application's transaction, after its notice agreed to send it.

The notice prepares the message first: an email that cannot be sent (nobody can receive it,
an invalid address) is refused here with a clear error, and nothing is written. The action's
payload is ``{"notice": <name>, "event": {...}}``; the message is prepared again before every
attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel

from outbox_core import ActionRequest, Enqueued, InvalidRequest, Outbox, default_outbox

from .adapter import BODY, KIND, TAG, EmailAdapter
from .errors import InvalidMail, NoRecipient
from .notices import EmailNotice, Mail, NoticeContext, NoticeRegistry, Prepared, Unreachable


@dataclass(frozen=True, slots=True)
class _Checked:
    notice: EmailNotice[Any]
    event: BaseModel
    payload: dict[str, Any]


def _check(
    outbox: Outbox,
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    idempotency_key: str,
) -> _Checked:
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
    # Decoded exactly as the executor will decode it, so prepare() sees the same event twice.
    decoded = entry.variants.decode(payload, idempotency_key, kind=KIND)
    return _Checked(registered, decoded, payload)


def _accept(name: str, prepared: Prepared) -> None:
    match prepared:
        case Mail():
            return
        case Unreachable(reason=reason, detail=detail):
            raise NoRecipient(
                "payload.event",
                f"the notice {name!r} has nobody to send this email to ({reason}"
                f"{': ' + detail if detail else ''}); nothing was enqueued",
                str(reason),
            )
    raise InvalidRequest(
        "payload.event",
        f"the notice {name!r} returned {type(prepared).__qualname__} from prepare(); "
        "return a Mail or an Unreachable",
    )


def _context(
    idempotency_key: str,
    workspace_id: str | None,
    subject_account_id: str | None,
    connection: Connection[Any] | AsyncConnection[Any] | None,
) -> NoticeContext:
    return NoticeContext(
        stage="enqueue",
        idempotency_key=idempotency_key,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        connection=connection,
    )


def _unsendable(checked: _Checked, exc: InvalidMail) -> InvalidRequest:
    return InvalidRequest(
        "payload.event",
        f"the notice {checked.notice.name!r} prepared an email that cannot be sent: {exc}",
    )


def _request(
    checked: _Checked,
    *,
    idempotency_key: str,
    lane_key: str | None,
    workspace_id: str | None,
    subject_account_id: str | None,
    max_attempts: int | None,
    expires_at: datetime | None,
    not_before: datetime | None,
) -> ActionRequest:
    return ActionRequest(
        kind=KIND,
        lane_key=lane_key if lane_key is not None else f"email:{idempotency_key}",
        idempotency_key=idempotency_key,
        payload=checked.payload,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
        not_before=not_before,
    )


def email_request(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: str | None = None,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    not_before: datetime | None = None,
    outbox: Outbox | None = None,
    connection: Connection[Any] | None = None,
) -> ActionRequest:
    """The :class:`~outbox_core.ActionRequest` of one email, once its notice prepared it
    (``prepare`` runs now, with ``connection`` in its context). For ``enqueue_many``.

    Raises :class:`~outbox_email.UnknownNotice`, :class:`~outbox_email.NoRecipient` or
    :class:`~outbox_core.InvalidRequest` (an event that does not fit, an invalid message).
    ``lane_key`` defaults to ``email:<idempotency_key>`` (no order between emails)."""
    outbox = outbox if outbox is not None else default_outbox()
    checked = _check(outbox, notice, event, idempotency_key)
    context = _context(idempotency_key, workspace_id, subject_account_id, connection)
    try:
        prepared = checked.notice.prepare(checked.event, context)
    except InvalidMail as exc:
        raise _unsendable(checked, exc) from None
    _accept(checked.notice.name, prepared)
    return _request(
        checked,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
        not_before=not_before,
    )


async def aemail_request(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: str | None = None,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    not_before: datetime | None = None,
    outbox: Outbox | None = None,
    connection: AsyncConnection[Any] | None = None,
) -> ActionRequest:
    """The async twin of :func:`email_request`: the notice's ``aprepare`` runs."""
    outbox = outbox if outbox is not None else default_outbox()
    checked = _check(outbox, notice, event, idempotency_key)
    context = _context(idempotency_key, workspace_id, subject_account_id, connection)
    try:
        prepared = await checked.notice.aprepare(checked.event, context)
    except InvalidMail as exc:
        raise _unsendable(checked, exc) from None
    _accept(checked.notice.name, prepared)
    return _request(
        checked,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
        not_before=not_before,
    )


def enqueue_email(
    conn: Connection[Any],
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: str | None = None,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    not_before: datetime | None = None,
    outbox: Outbox | None = None,
) -> Enqueued:
    """Enqueue one email in ``conn``'s transaction: it exists exactly when that commits.

    The notice prepares the message first (refusals raise, nothing is written). A second call
    with the same ``idempotency_key`` returns the first action. ``outbox`` defaults to the
    process's (``OUTBOX_*`` settings, notices from the installed plugins)."""
    outbox = outbox if outbox is not None else default_outbox()
    request = email_request(
        notice,
        event,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
        not_before=not_before,
        outbox=outbox,
        connection=conn,
    )
    return outbox.enqueue(conn, request)


async def aenqueue_email(
    conn: AsyncConnection[Any],
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    idempotency_key: str,
    lane_key: str | None = None,
    workspace_id: str | None = None,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    not_before: datetime | None = None,
    outbox: Outbox | None = None,
) -> Enqueued:
    """The async twin of :func:`enqueue_email`."""
    outbox = outbox if outbox is not None else default_outbox()
    request = await aemail_request(
        notice,
        event,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
        not_before=not_before,
        outbox=outbox,
        connection=conn,
    )
    return await outbox.aenqueue(conn, request)
