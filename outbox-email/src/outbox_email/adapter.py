"""``EmailAdapter``: the only adapter of ``EMAIL`` and the only code that talks SMTP.

Longer than 450 lines on purpose: it is one attempt's SMTP conversation, stage by stage, next to
the table below of what each stage's answer makes of the attempt, and the two are read together;
the pool of sessions it draws from is in :mod:`outbox_email.smtp_sessions`.

One attempt: the notice prepares the message again (nobody can receive it: FAILED with the
notice's reason, nothing sent); a connection is taken from the pool or opened (connect, TLS,
EHLO, AUTH); ``begin_write()``; then one SMTP transaction, MAIL FROM, RCPT TO, DATA and the
content. The result follows from what the relay provably holds:

==========================================  ==============================================
what happened                               result
==========================================  ==============================================
connect, TLS, greeting or AUTH failed       Retry (before the fence: nothing was sent)
4xx at MAIL, RCPT or DATA                   Retry (the relay holds nothing)
5xx at MAIL, RCPT or DATA                   Failed, stop reason ``SMTP_<code>``
disconnect or timeout before the content    Retry (a relay keeps no message without its
                                            final ``.``)
a pooled connection found dead at MAIL      one new connection in the same attempt
(disconnect or 421)
2xx after the content                       Done, ``readback_ref`` = the Message-ID
4xx after the content                       Retry (the relay said it did not take it)
5xx after the content                       Failed, ``SMTP_<code>``
disconnect, timeout or any other answer     Uncertain, ``WRITE_UNCONFIRMED``: it may have
after the content was handed to the socket  been accepted, so it is never sent again
==========================================  ==============================================

A failed login is retried whatever its code (also 535): it is the relay's or the operator's
problem, which a later attempt may find fixed; the last attempt ends FAILED with
ATTEMPTS_EXHAUSTED.

Each result's ``detail`` (kept on the action, shown by ``outbox show`` and ``outbox status``)
names the SMTP reply code, the enhanced status code when the reply starts with one, and the
stage (``"SMTP 451 4.7.1 at rcpt"``), or the exception's type (``"SMTPServerDisconnected at
data, before the content"``). Never the reply's text, which may quote the recipient's or the
sender's address, and never the message.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel, model_validator

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    ConfiguredAdapter,
    Done,
    EnqueueCheck,
    Failed,
    OutboxSettings,
    PerLoop,
    Retry,
    StopReason,
    Uncertain,
    action_event,
)
from outbox_core.steps import arun, run

from .enqueue_check import email_check_steps
from .errors import InvalidMail
from .message import data_transfer, message_id, render
from .notices import (
    EmailNotice,
    Mail,
    NoticeContext,
    NoticeRegistry,
    Unreachable,
    UnreachableReason,
)
from .settings import EmailSettings
from .smtp_sessions import SmtpSession, SmtpSessions, smtp_library

if TYPE_CHECKING:
    from aiosmtplib import SMTP, SMTPResponse

KIND = "EMAIL"
TAG, BODY = "notice", "event"
INVALID_MESSAGE = "INVALID_MESSAGE"
REFUSED_CODES = range(500, 600)
# 5xx replies to MAIL that refuse this email itself (its declared size, its parameters): every
# other 5xx to MAIL refuses the sender, and is retried.
MESSAGE_REFUSED_AT_MAIL = frozenset({552, 555})
NO_NOTICE = "outbox_email:none"


def refused_reason(code: int) -> str:
    """The stop reason of a 5xx refusal: ``SMTP_550``."""
    return f"SMTP_{code}"


def _connect_stage(exc: BaseException) -> str:
    """Where opening a session failed, when the exception says so: aiosmtplib opens, greets,
    says EHLO, starts TLS and logs in within one ``connect()``."""
    lib = smtp_library()
    if isinstance(exc, lib.SMTPAuthenticationError):
        return " at AUTH"
    # aiosmtplib's own words when the relay offers no STARTTLS, or refuses it.
    if isinstance(exc, lib.SMTPException) and "STARTTLS" in str(exc).upper():
        return " at STARTTLS"
    if isinstance(exc, ssl.SSLError):
        return " at the TLS handshake"
    return ""


# An enhanced status code (RFC 3463) at the start of a reply's text: "5.1.1 <a@b>: unknown".
_ENHANCED = re.compile(r"\A\s*([245]\.\d{1,3}\.\d{1,3})(?!\S)")


def smtp_detail(code: int | None, message: object = None, *, stage: str | None = None) -> str:
    """A result's detail for a relay's answer: ``"SMTP 550 5.1.1 at rcpt"``. The reply's text
    is left out (it may quote an address); only its enhanced status code is kept."""
    parts = ["SMTP", str(code) if code is not None else "reply"]
    if isinstance(message, str) and (enhanced := _ENHANCED.match(message)):
        parts.append(enhanced.group(1))
    if stage is not None:
        parts.append(f"at {stage}")
    return " ".join(parts)


class NoNotice(BaseModel):
    """The body of the placeholder variant declared while no notice is registered: it decodes
    nothing, so such a build claims no ``EMAIL`` row (a newer build owns them)."""

    @model_validator(mode="before")
    @classmethod
    def _never(cls, value: Any) -> Any:
        raise ValueError(
            "no email notice is registered; register one with the "
            "outbox_register_email_notices hook"
        )


@dataclass(slots=True)
class _Progress:
    stage: str = "mail"
    content_sent: bool = False
    """True once the content was handed to the transport: from then on the relay may hold it."""


class EmailAdapter(ConfiguredAdapter[EmailSettings]):
    """Sends the ``EMAIL`` actions: one email notice each, over SMTP, at most once.

    The plugin registers a class bound to the notices that the plugins registered
    (:meth:`bind`); its ``variants()`` are tagged by notice name. Settings come from
    :class:`EmailSettings` (``OUTBOX_EMAIL_*``) unless the bound class carries its own.
    """

    kind = KIND
    at_most_once = True
    instance_level = True
    default_max_attempts = 8
    retry_base = timedelta(seconds=30)
    retry_cap = timedelta(minutes=30)
    stop_reasons = frozenset(
        {str(reason) for reason in UnreachableReason}
        | {INVALID_MESSAGE}
        | {refused_reason(code) for code in REFUSED_CODES}
    )

    # The SMTP transaction after the fence is bounded by the send timeout.
    provider_timeout_settings = ("send_timeout_seconds",)

    notices: ClassVar[NoticeRegistry | None] = None
    """The notices this class decodes (set by :meth:`bind`)."""

    def __init__(
        self,
        settings: EmailSettings | None = None,
        *,
        notices: NoticeRegistry | None = None,
        schema: str = "outbox",
        fence_margin_seconds: float = 60.0,
    ) -> None:
        super().__init__(settings, schema=schema, fence_margin_seconds=fence_margin_seconds)
        # No more attempts at once than connections: the others would wait for one before
        # their fence while their lease runs down, and be abandoned.
        self.max_concurrency = self.settings.max_connections
        found = notices if notices is not None else type(self).notices
        self._notices = found if found is not None else NoticeRegistry()
        self._connections = PerLoop(
            lambda: SmtpSessions(self.settings, self.settings.local_hostname),
            SmtpSessions.aclose,
        )

    # -- declaration ---------------------------------------------------------------------------

    @classmethod
    def bind(
        cls,
        notices: NoticeRegistry | None = None,
        *,
        settings: EmailSettings | None = None,
        **values: Any,
    ) -> type[Self]:
        """This adapter class bound to ``notices`` (and to ``settings`` instead of the
        environment): what the plugin registers, and what tests register for one test."""
        return super().bind(settings=settings, notices=notices, **values)

    @classmethod
    def variants(cls) -> ActionVariants:
        """``{"notice": <name>, "event": {...}}``, one event model per registered notice."""
        notices = cls.notices if cls.notices is not None else NoticeRegistry()
        bodies: dict[str, type[BaseModel]] = {notice.name: notice.event for notice in notices}
        if not bodies:
            return ActionVariants.tagged(TAG, BODY, {NO_NOTICE: NoNotice}, placeholder=NO_NOTICE)
        return ActionVariants.tagged(TAG, BODY, bodies)

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        smtp_library()
        return super().build(settings)

    # -- at enqueue ----------------------------------------------------------------------------

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        """The notice prepares the message in the caller's transaction (``prepare``): an email
        that cannot be sent is refused (:class:`~outbox_email.NoRecipient`,
        :class:`~outbox_core.InvalidRequest`) on every enqueue path, and nothing is written."""
        run(conn, email_check_steps(cls._notice(check), check))

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        """The async twin of :meth:`check_enqueue`: the notice's ``aprepare`` runs."""
        await arun(conn, email_check_steps(cls._notice(check), check))

    @classmethod
    def _notice(cls, check: EnqueueCheck) -> EmailNotice[Any]:
        notices = cls.notices if cls.notices is not None else NoticeRegistry()
        return notices.get(str(check.payload[TAG]))

    async def aclose(self) -> None:
        """Close the pooled connections (QUIT). The executor's shutdown should call it."""
        await self._connections.aclose()

    # -- one attempt ---------------------------------------------------------------------------

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        name = str(attempt.payload.get(TAG))
        notice = self._notices.get(name)
        context = NoticeContext(
            stage="attempt",
            idempotency_key=attempt.idempotency_key,
            workspace_id=attempt.workspace_id,
            subject_account_id=attempt.subject_account_id,
            attempt=attempt.number,
        )
        try:
            # Typed loosely on purpose: a notice is application code and may return anything.
            prepared: object = await notice.aprepare(attempt.body, context)
        except InvalidMail as exc:
            self._event(
                "email.invalid_message", attempt, logging.WARNING, notice=name, error=str(exc)
            )
            return Failed(INVALID_MESSAGE)
        except Exception as exc:
            self._event(
                "email.prepare_failed",
                attempt,
                logging.WARNING,
                notice=name,
                error=type(exc).__name__,
            )
            return Retry(
                detail=f"notice {name!r} could not prepare the message: {type(exc).__name__}"
            )
        match prepared:
            case Unreachable(reason=reason, detail=detail):
                self._event(
                    "email.unreachable",
                    attempt,
                    logging.INFO,
                    notice=name,
                    reason=str(reason),
                    detail=detail,
                )
                return Failed(str(reason))
            case Mail():
                mail = prepared
            case _:
                self._event(
                    "email.invalid_message",
                    attempt,
                    logging.WARNING,
                    notice=name,
                    error=f"prepare() returned {type(prepared).__name__}",
                )
                return Failed(INVALID_MESSAGE)

        sender = self.settings.sender_address
        domain = self.settings.effective_message_id_domain
        if sender is None or domain is None:
            self._event(
                "email.not_configured", attempt, logging.ERROR, missing="OUTBOX_EMAIL_SENDER"
            )
            return Failed(StopReason.NOT_CONFIGURED, detail="OUTBOX_EMAIL_SENDER is not set")
        reference = message_id(attempt.idempotency_key, domain)
        content = data_transfer(render(mail, sender=sender, message_id=reference))

        pool = self._connections.get()
        try:
            connection = await pool.acquire()
        except Exception as exc:
            # Connect, TLS, greeting, EHLO or AUTH failed: no transaction began.
            code = getattr(exc, "code", None)
            self._event(
                "email.smtp.connect_failed",
                attempt,
                logging.WARNING,
                error=type(exc).__name__,
                code=code,
                detail=str(exc)[:300],  # the relay's or TLS's words, never the message
            )
            answer = f", {smtp_detail(code, getattr(exc, 'message', None))}" if code else ""
            stage = _connect_stage(exc)
            return Retry(
                detail=f"connecting to the relay failed{stage}: {type(exc).__name__}{answer}"
            )
        try:
            fenced = await attempt.fence().begin_write()
        except BaseException:
            pool.release(connection, reusable=True)
            raise
        if not fenced:
            pool.release(connection, reusable=True)
            return Abandoned()
        return await self._send(
            attempt, pool, connection, sender.addr_spec, mail, content, reference
        )

    async def _send(
        self,
        attempt: ActionAttempt,
        pool: SmtpSessions,
        connection: SmtpSession,
        envelope_sender: str,
        mail: Mail,
        content: bytes,
        reference: str,
    ) -> AdapterResult:
        """One SMTP transaction on ``connection``; releases it whatever happens."""
        lib = smtp_library()
        progress = _Progress()
        try:
            async with asyncio.timeout(self.settings.send_timeout_seconds):
                await self._mail_from(attempt, pool, connection, envelope_sender, progress)
                progress.stage = "rcpt"
                for recipient in mail.recipients:
                    await connection.smtp.rcpt(recipient)
                progress.stage = "data"
                start = await connection.smtp.execute_command(b"DATA")
                if start.code != 354:
                    raise lib.SMTPDataError(start.code, start.message)
                progress.stage = "content"
                reply = await self._transfer(connection.smtp, content, progress)
        except lib.SMTPResponseException as exc:
            pool.release(connection, reusable=False)
            return self._answered(attempt, progress, exc.code, exc.message)
        except (lib.SMTPException, OSError) as exc:  # disconnects and timeouts are OSErrors
            pool.release(connection, reusable=False)
            return self._lost(attempt, progress, exc)
        except Exception as exc:
            # Anything else (aiosmtplib refusing a value, say) before the content left is
            # provably no delivery; after it, the relay may hold the email.
            pool.release(connection, reusable=False)
            return self._lost(attempt, progress, exc)
        except BaseException:
            pool.release(connection, reusable=False)
            raise
        if 200 <= reply.code < 300:
            connection.sent += 1
            if self.settings.reuse_connections:
                pool.release(connection, reusable=True)
            else:
                try:
                    await pool.quit(connection)
                finally:
                    pool.release(connection, reusable=False)
            self._event("email.sent", attempt, logging.DEBUG, code=reply.code)
            return Done(reference, detail=smtp_detail(reply.code, reply.message))
        pool.release(connection, reusable=False)
        return self._answered(attempt, progress, reply.code, reply.message)

    async def _mail_from(
        self,
        attempt: ActionAttempt,
        pool: SmtpSessions,
        connection: SmtpSession,
        envelope_sender: str,
        progress: _Progress,
    ) -> None:
        """MAIL FROM. A pooled session that turns out dead here (the relay closed it while it
        was idle) is replaced once: no byte of this message has been sent yet."""
        lib = smtp_library()
        try:
            await connection.smtp.mail(envelope_sender)
            return
        except (lib.SMTPServerDisconnected, lib.SMTPSenderRefused) as exc:
            dead = isinstance(exc, lib.SMTPServerDisconnected) or exc.code == 421
            if not (connection.reused and dead):
                raise
        self._event("email.smtp.reconnect", attempt, logging.INFO)
        progress.stage = "connect"
        await pool.reopen(connection)
        progress.stage = "mail"
        await connection.smtp.mail(envelope_sender)

    async def _transfer(self, smtp: SMTP, content: bytes, progress: _Progress) -> SMTPResponse:
        """Send the content after the 354 and read the final reply. aiosmtplib's ``data()``
        does not say whether a failure came before or after the content left; this does."""
        protocol = smtp.protocol
        if protocol is None:
            raise smtp_library().SMTPServerDisconnected("Connection lost before the content")
        protocol.write(content)  # raises, sending nothing, when the connection is already gone
        progress.content_sent = True
        try:
            return await protocol.read_response(timeout=self.settings.command_timeout_seconds)
        except BaseException:
            smtp.close()  # a session without its final reply is out of step: never reuse it
            raise

    # -- results -------------------------------------------------------------------------------

    def _answered(
        self, attempt: ActionAttempt, progress: _Progress, code: int, message: object = None
    ) -> AdapterResult:
        """The relay answered ``code`` at ``progress.stage`` (not 2xx after the content)."""
        detail = smtp_detail(code, message, stage=progress.stage)
        if progress.stage == "connect":
            # Replacing a dead pooled session failed (greeting, TLS or AUTH): as before the fence.
            return self._lost(attempt, progress, ValueError(f"reconnect answered {code}"), detail)
        if 400 <= code < 500:
            self._event(
                "email.smtp.retry", attempt, logging.WARNING, stage=progress.stage, code=code
            )
            return Retry(detail=detail)
        if progress.stage == "mail" and code not in MESSAGE_REFUSED_AT_MAIL:
            # A 5xx to MAIL refuses the sender, not the email: a login the relay wants and did
            # not get (530), a sender it does not accept (550, 553), a policy block (554). The
            # relay's configuration or ours, as a failed login is, which a later attempt may
            # find fixed; nothing was accepted.
            self._event(
                "email.smtp.sender_refused", attempt, logging.ERROR, stage=progress.stage, code=code
            )
            return Retry(detail=f"{detail}: the relay refused the sender")
        if code in REFUSED_CODES:
            self._event(
                "email.smtp.refused", attempt, logging.WARNING, stage=progress.stage, code=code
            )
            return Failed(refused_reason(code), detail=detail)
        return self._lost(attempt, progress, ValueError(f"unexpected reply {code}"), detail)

    def _lost(
        self,
        attempt: ActionAttempt,
        progress: _Progress,
        exc: BaseException,
        detail: str | None = None,
    ) -> AdapterResult:
        """No usable answer: a disconnect, a timeout, a reply that is neither yes nor no
        (``detail``: that reply)."""
        what = detail or type(exc).__name__
        if progress.content_sent:
            self._event(
                "email.smtp.uncertain",
                attempt,
                logging.WARNING,
                stage=progress.stage,
                error=type(exc).__name__,
            )
            return Uncertain(
                StopReason.WRITE_UNCONFIRMED, detail=f"{what} after the content was sent"
            )
        self._event(
            "email.smtp.retry",
            attempt,
            logging.WARNING,
            stage=progress.stage,
            error=type(exc).__name__,
        )
        where = "" if detail else f" at {progress.stage}"
        return Retry(detail=f"{what}{where}, before the content")

    @staticmethod
    def _event(name: str, attempt: ActionAttempt, level: int, **fields: Any) -> None:
        action_event(name, attempt.id, attempt.kind, level=level, **fields)
