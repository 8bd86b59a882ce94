"""An SMTP server on loopback, built on aiosmtpd, that records what it accepted and fails on
demand like a real relay: refuse the connection, fail AUTH, reply 421/451/550 at any stage,
drop the connection after receiving the content, or stall.

Longer than 450 lines on purpose: one server, whose SMTP session (``_Smtpd``, ``_Greeting``) and
fault switches (``reply``, ``drop``, ``stall``) share one table of rules that the switches fill and
each stage takes from; split, each half would reach into the other's privates.

It runs its own event loop in a thread, so it serves sync tests (``outbox_db.drain()``) and
async tests alike. Needs ``aiosmtpd`` (the ``test`` extra of outbox-email).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import functools
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from email.message import EmailMessage
from functools import cached_property
from typing import Any, Literal, TypeVar, cast

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from ..settings import EmailSettings

Stage = Literal["connect", "ehlo", "auth", "mail", "rcpt", "data", "content"]
"""Where a fault strikes: ``connect`` (instead of the greeting), ``ehlo``, ``auth``, ``mail``,
``rcpt``, ``data`` (the DATA command, instead of 354) and ``content`` (instead of the final
reply, after the whole message was received)."""
STAGES: tuple[Stage, ...] = ("connect", "ehlo", "auth", "mail", "rcpt", "data", "content")
SENDER = "Outbox Test <outbox@example.test>"
STALL_SECONDS = 3600.0

T = TypeVar("T")


@dataclass(frozen=True)
class ReceivedMessage:
    """One message the server received in full (its terminating ``.`` line arrived)."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    reply: int | None
    """The final reply sent: 250, a 4xx/5xx refusal, or None (dropped or stalled: the relay
    may deliver it, the client cannot know)."""

    @cached_property
    def message(self) -> EmailMessage:
        return email.message_from_bytes(self.data, policy=email.policy.default)

    @property
    def message_id(self) -> str | None:
        value = self.message["Message-ID"]
        return None if value is None else str(value).strip()

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def text(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return "" if part is None else _lines(cast(EmailMessage, part).get_content())

    @property
    def html(self) -> str | None:
        part = self.message.get_body(preferencelist=("html",))
        return None if part is None else _lines(cast(EmailMessage, part).get_content())


def _lines(text: str) -> str:
    """The body as Python text: the wire's CRLF line ends as ``\n``."""
    return text.replace("\r\n", "\n")


@dataclass
class _Rule:
    stage: Stage
    action: Literal["reply", "drop", "stall"]
    code: int = 0
    text: str = ""
    times: int | None = 1
    seconds: float = STALL_SECONDS


_DEFAULT_TEXT = {
    421: "4.3.2 Service not available, closing channel",
    450: "4.2.1 Mailbox unavailable, try again later",
    451: "4.3.0 Local error in processing, try again later",
    452: "4.3.1 Insufficient system storage",
    454: "4.7.0 Temporary authentication failure",
    535: "5.7.8 Authentication credentials invalid",
    550: "5.1.1 Mailbox unavailable",
    552: "5.3.4 Message size exceeds fixed limit",
    553: "5.1.3 Mailbox name not allowed",
    554: "5.7.1 Transaction failed",
}


class _Handler:
    """aiosmtpd's handler hooks: the final reply to the content."""

    def __init__(self, server: SmtpTestServer) -> None:
        self.server = server

    async def handle_DATA(self, smtpd: _Smtpd, session: Session, envelope: Envelope) -> str:  # noqa: N802
        rule = self.server._take("content")
        content = envelope.original_content or b""

        def received(reply: int | None) -> ReceivedMessage:
            return ReceivedMessage(
                str(envelope.mail_from), tuple(envelope.rcpt_tos), content, reply
            )

        if rule is None:
            self.server._record(received(250), accepted=True)
            return "250 2.0.0 OK: queued"
        match rule.action:
            case "reply":
                self.server._record(received(rule.code), accepted=200 <= rule.code < 300)
                if rule.code == 421:
                    await smtpd.push(f"421 {rule.text}")
                    await smtpd.hang_up()
                return f"{rule.code} {rule.text}"
            case "drop":
                # The relay has the whole message; the client never hears about it.
                self.server._record(received(None), accepted=True)
                await smtpd.hang_up()
            case "stall":
                self.server._record(received(None), accepted=True)
                await asyncio.sleep(rule.seconds)
        return "250 2.0.0 OK: queued"


class _Smtpd(SMTP):
    """aiosmtpd's SMTP with a fault check before each command."""

    server: SmtpTestServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Every command, whatever it is, counts as a request that reached the relay.
        self._smtp_methods = {
            name: self._counted(method) for name, method in self._smtp_methods.items()
        }

    def _counted(
        self, method: Callable[[str], Awaitable[None]]
    ) -> Callable[[str], Awaitable[None]]:
        @functools.wraps(method)  # keeps aiosmtpd's syntax marks, which HELP and EHLO read
        async def counted(arg: str) -> None:
            self.server._count("commands")
            await method(arg)

        return counted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server._open.add(self)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self.server._open.discard(self)
        super().connection_lost(error)

    def close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def hang_up(self) -> None:
        """Close the connection; the session's task is cancelled when the loss is noticed."""
        if self.transport is not None:
            self.transport.close()
        await asyncio.Event().wait()

    async def _fault(self, stage: Stage) -> bool:
        # aiosmtplib tries every AUTH mechanism in turn: an AUTH fault fails them all in the
        # session it struck.
        rule: _Rule | None = getattr(self.session, "outbox_auth_fault", None)
        if stage != "auth" or rule is None:
            rule = self.server._take(stage)
            if stage == "auth" and rule is not None:
                setattr(self.session, "outbox_auth_fault", rule)  # noqa: B010
        if rule is None:
            return False
        match rule.action:
            case "reply":
                await self.push(f"{rule.code} {rule.text}")
                if rule.code == 421:
                    await self.hang_up()
            case "drop":
                await self.hang_up()
            case "stall":
                await asyncio.sleep(rule.seconds)
        return True

    async def smtp_EHLO(self, hostname: str) -> None:  # noqa: N802
        if not await self._fault("ehlo"):
            await super().smtp_EHLO(hostname)

    async def smtp_AUTH(self, arg: str) -> None:  # noqa: N802
        if not await self._fault("auth"):
            await super().smtp_AUTH(arg)

    async def smtp_MAIL(self, arg: str | None) -> None:  # noqa: N802
        if await self._fault("mail"):
            return
        self.server._count("mail_commands")
        if self.server.credentials is not None and not (
            self.session and self.session.authenticated
        ):
            await self.push("530 5.7.0 Authentication required")
            return
        await super().smtp_MAIL(arg)

    async def smtp_RCPT(self, arg: str | None) -> None:  # noqa: N802
        if not await self._fault("rcpt"):
            await super().smtp_RCPT(arg)

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802
        if not await self._fault("data"):
            await super().smtp_DATA(arg)


class _Greeting(asyncio.Protocol):
    """A connection the ``connect`` fault takes over: dropped, answered, or left silent."""

    def __init__(self, rule: _Rule, server: SmtpTestServer) -> None:
        self.rule = rule
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server._open.add(self)
        match self.rule.action:
            case "drop":
                self.transport.close()
            case "reply":
                self.transport.write(f"{self.rule.code} {self.rule.text}\r\n".encode())
                self.transport.close()
            case "stall":
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._open.discard(self)

    def close_transport(self) -> None:
        self.transport.close()


class SmtpTestServer:
    """An SMTP relay on loopback for tests. Start it (``with SmtpTestServer() as server:``),
    point the adapter at it (:meth:`settings`, or :func:`~outbox_email.testing.serve_email`),
    tell it how to fail, and read what it received::

        server.reply("rcpt", 451)          # the next RCPT gets 451, then all is well again
        server.drop("content")             # receive the next message, then hang up
        server.stall("content", times=None)  # never answer a message's final dot
        assert len(server.messages) == 1

    ``credentials=("user", "secret")`` makes AUTH (PLAIN or LOGIN) required. ``tls`` is
    ``"none"``, ``"starttls"`` or ``"implicit"`` with ``certfile`` and ``keyfile``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        credentials: tuple[str, str] | None = None,
        tls: Literal["none", "starttls", "implicit"] = "none",
        certfile: str | None = None,
        keyfile: str | None = None,
        hostname: str = "smtp.example.test",
    ) -> None:
        self.host = host
        self.port = port
        self.credentials = credentials
        self.tls = tls
        self.hostname = hostname
        self._tls_context: ssl.SSLContext | None = None
        if tls != "none":
            if certfile is None:
                raise ValueError(f"tls={tls!r} needs certfile (and keyfile)")
            self._tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls_context.load_cert_chain(certfile, keyfile)
        self.certfile = certfile
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._messages: list[ReceivedMessage] = []
        self._refused: list[ReceivedMessage] = []
        self._counts: dict[str, int] = {"connections": 0, "mail_commands": 0, "commands": 0}
        self._open: set[_Smtpd | _Greeting] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> SmtpTestServer:
        if self._thread is not None:
            raise RuntimeError("the SMTP test server is already running")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(
                        self._protocol,
                        self.host,
                        self.port,
                        ssl=self._tls_context if self.tls == "implicit" else None,
                    )
                )
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            self.port = self._server.sockets[0].getsockname()[1]
            loop.call_soon(ready.set)
            loop.run_forever()
            self._server.close()
            for protocol in list(self._open):
                protocol.close_transport()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="outbox-email-smtp-test", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> SmtpTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults --------------------------------------------------------------------------------

    def reply(
        self, stage: Stage, code: int, *, times: int | None = 1, text: str | None = None
    ) -> None:
        """Answer ``code`` at ``stage`` instead of going on, the next ``times`` times (None:
        always). At ``content`` the message was received and is refused (4xx/5xx); a 421
        also closes the connection."""
        self._add(_Rule(stage, "reply", code, text or _DEFAULT_TEXT.get(code, "Fault"), times))

    def drop(self, stage: Stage, *, times: int | None = 1) -> None:
        """Close the connection at ``stage`` without a word. At ``connect``: a refused
        connection; at ``content``: after the whole message arrived (it counts as received)."""
        self._add(_Rule(stage, "drop", times=times))

    def stall(self, stage: Stage, *, times: int | None = 1, seconds: float = STALL_SECONDS) -> None:
        """Say nothing at ``stage`` for ``seconds``. At ``content``: the message arrived (it
        counts as received) and its final reply never comes in time."""
        self._add(_Rule(stage, "stall", times=times, seconds=seconds))

    def refuse_connections(self, *, times: int | None = 1) -> None:
        """The next ``times`` connections are closed before the greeting."""
        self.drop("connect", times=times)

    def clear_faults(self) -> None:
        with self._lock:
            self._rules.clear()

    def reset(self) -> None:
        """Forget faults, messages and counts."""
        with self._lock:
            self._rules.clear()
            self._messages.clear()
            self._refused.clear()
            self._counts = dict.fromkeys(self._counts, 0)

    def close_connections(self) -> None:
        """Close every open connection from the server side (an idle timeout at the relay)."""

        async def close_all() -> None:
            for protocol in list(self._open):
                protocol.close_transport()
            await asyncio.sleep(0.01)

        self._call(close_all)

    # -- what happened -------------------------------------------------------------------------

    @property
    def messages(self) -> list[ReceivedMessage]:
        """Messages the relay took (250), or received in full before it dropped or stalled:
        each may reach its recipients."""
        with self._lock:
            return list(self._messages)

    @property
    def refused(self) -> list[ReceivedMessage]:
        """Messages received in full and refused with a 4xx/5xx final reply."""
        with self._lock:
            return list(self._refused)

    @property
    def connections(self) -> int:
        """TCP connections accepted so far."""
        with self._lock:
            return self._counts["connections"]

    @property
    def mail_commands(self) -> int:
        """MAIL FROM commands received so far (each begins a transaction)."""
        with self._lock:
            return self._counts["mail_commands"]

    @property
    def commands(self) -> int:
        """SMTP commands received so far, of every kind (EHLO, MAIL, QUIT, ...)."""
        with self._lock:
            return self._counts["commands"]

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def settings(self, **overrides: Any) -> EmailSettings:
        """EmailSettings that reach this server, with short timeouts for tests."""
        values: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "tls": self.tls,
            "sender": SENDER,
            "message_id_domain": "outbox.example.test",
            "connect_timeout_seconds": 2.0,
            "command_timeout_seconds": 2.0,
            "send_timeout_seconds": 10.0,
            "cert_bundle": self.certfile,
            "local_hostname": "client.example.test",
        }
        if self.credentials is not None:
            values["username"], values["password"] = self.credentials
        values.update(overrides)
        return EmailSettings(**values)

    # -- internals -----------------------------------------------------------------------------

    def _add(self, rule: _Rule) -> None:
        if rule.stage not in STAGES:
            raise ValueError(f"stage {rule.stage!r}: one of {', '.join(STAGES)}")
        with self._lock:
            self._rules.append(rule)

    def _take(self, stage: Stage) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.stage == stage:
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule
        return None

    def _record(self, message: ReceivedMessage, *, accepted: bool) -> None:
        with self._lock:
            (self._messages if accepted else self._refused).append(message)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _call(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the SMTP test server is not running")
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(10)

    def _protocol(self) -> asyncio.BaseProtocol:
        self._count("connections")
        rule = self._take("connect")
        if rule is not None:
            return _Greeting(rule, self)
        smtpd = _Smtpd(
            _Handler(self),
            hostname=self.hostname,
            tls_context=self._tls_context if self.tls == "starttls" else None,
            require_starttls=self.tls == "starttls",
            auth_require_tls=False,
            authenticator=self._authenticate if self.credentials is not None else None,
            loop=self._loop,
        )
        smtpd.server = self
        return smtpd

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        assert self.credentials is not None
        user, password = self.credentials
        ok = isinstance(auth_data, LoginPassword) and (
            auth_data.login == user.encode() and auth_data.password == password.encode()
        )
        return AuthResult(success=ok, handled=False)
