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
from typing import Any, Required, TypedDict, Unpack

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel

from outbox_core import ActionRequest, Enqueued, InvalidRequest, Outbox, default_outbox
from outbox_core.steps import Call, Steps, arun, run

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


def _request(checked: _Checked, options: EmailOptions) -> ActionRequest:
    key = options["idempotency_key"]
    lane_key = options.get("lane_key")
    return ActionRequest(
        kind=KIND,
        lane_key=lane_key if lane_key is not None else f"email:{key}",
        idempotency_key=key,
        payload=checked.payload,
        workspace_id=options.get("workspace_id"),
        subject_account_id=options.get("subject_account_id"),
        max_attempts=options.get("max_attempts"),
        expires_at=options.get("expires_at"),
        not_before=options.get("not_before"),
    )


# Each entry point is written once, as steps (outbox_core.steps): the checks, the notice's
# prepare (sync or async) and the enqueue. The public functions only run them.


def email_request_steps(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> Steps[ActionRequest]:
    """:func:`email_request` as steps: the notice's ``prepare`` (``aprepare`` from async code)
    runs with the connection the steps run on in its context."""
    key = options["idempotency_key"]
    checked = _check(_outbox(options), notice, event, key)

    def context(conn: Connection[Any] | AsyncConnection[Any] | None) -> NoticeContext:
        workspace, subject = options.get("workspace_id"), options.get("subject_account_id")
        return _context(key, workspace, subject, conn)

    try:
        prepared = yield Call(
            lambda conn: checked.notice.prepare(checked.event, context(conn)),
            lambda conn: checked.notice.aprepare(checked.event, context(conn)),
            what=f"the notice {checked.notice.name!r}",
        )
    except InvalidMail as exc:
        raise _unsendable(checked, exc) from None
    _accept(checked.notice.name, prepared)
    return _request(checked, options)


def enqueue_email_steps(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    **options: Unpack[EmailOptions],
) -> Steps[Enqueued]:
    """:func:`enqueue_email` as steps, to compose into an application's own operation."""
    request = yield from email_request_steps(notice, event, **options)
    return (yield from _outbox(options).enqueue_steps(request))


def email_request(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    connection: Connection[Any] | None = None,
    **options: Unpack[EmailOptions],
) -> ActionRequest:
    """The :class:`~outbox_core.ActionRequest` of one email, once its notice prepared it
    (``prepare`` runs now, with ``connection`` in its context). For ``enqueue_many``.
    ``options``: see :class:`EmailOptions`.

    Raises :class:`~outbox_email.UnknownNotice`, :class:`~outbox_email.NoRecipient` or
    :class:`~outbox_core.InvalidRequest` (an event that does not fit, an invalid message)."""
    return run(connection, email_request_steps(notice, event, **options))


async def aemail_request(
    notice: str | EmailNotice[Any],
    event: BaseModel | Mapping[str, Any],
    *,
    connection: AsyncConnection[Any] | None = None,
    **options: Unpack[EmailOptions],
) -> ActionRequest:
    """The async twin of :func:`email_request`: the notice's ``aprepare`` runs."""
    return await arun(connection, email_request_steps(notice, event, **options))


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
