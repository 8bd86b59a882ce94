"""The enqueue-time check of ``EMAIL``: the notice prepares the message in the caller's
transaction, and an email that cannot be sent is refused before anything is written.

``EmailAdapter.check_enqueue`` (and its async twin) runs it, so every path that enqueues an
``EMAIL`` passes it: ``enqueue``, ``enqueue_many``, ``admit``, and ``enqueue_email``, which is
built on ``enqueue``. Written once as steps: the sync form calls the notice's ``prepare``, the
async form its ``aprepare``.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import EnqueueCheck, InvalidRequest
from outbox_core.steps import Call, Steps

from .errors import InvalidMail, NoRecipient
from .notices import EmailNotice, Mail, NoticeContext, Prepared, Unreachable


def email_check_steps(notice: EmailNotice[Any], check: EnqueueCheck) -> Steps[None]:
    """Refuse ``check``'s email unless its notice prepares a message now: :class:`NoRecipient`
    (nobody can receive it), :class:`~outbox_core.InvalidRequest` (an invalid message)."""
    request = check.request
    name = notice.name

    def context(conn: Connection[Any] | AsyncConnection[Any] | None) -> NoticeContext:
        return NoticeContext(
            stage="enqueue",
            idempotency_key=request.idempotency_key,
            workspace_id=request.workspace_id,
            subject_account_id=request.subject_account_id,
            connection=conn,
        )

    sync_form = type(notice).prepare is not EmailNotice.prepare
    try:
        prepared = yield Call(
            (lambda conn: notice.prepare(check.body, context(conn))) if sync_form else None,
            lambda conn: notice.aprepare(check.body, context(conn)),
            what=f"the notice {name!r} has only an async form ({type(notice).__qualname__}"
            ".aprepare): enqueue it from async code with `await aenqueue_email(...)`, or write "
            "its prepare() too; nothing was written",
        )
    except InvalidMail as exc:
        raise InvalidRequest(
            "payload.event", f"the notice {name!r} prepared an email that cannot be sent: {exc}"
        ) from None
    _accept(name, prepared)


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
