"""The SMTP sessions of :class:`outbox_email.adapter.EmailAdapter`: aiosmtplib imported when an
adapter is built (not when the plugin is loaded), one session, and the pool of them that one event
loop keeps (at most ``max_connections`` open, idle ones reused for ``idle_seconds``)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING

from .settings import EmailSettings

if TYPE_CHECKING:
    from aiosmtplib import SMTP

_module: ModuleType | None = None


def smtp_library() -> ModuleType:
    """aiosmtplib, imported when an adapter is built, not when the plugin is loaded."""
    global _module
    if _module is None:
        import aiosmtplib

        _module = aiosmtplib
    return _module


class SmtpSession:
    """One SMTP session; ``smtp`` is replaced in place when it is reopened."""

    __slots__ = ("idle_since", "sent", "smtp")

    def __init__(self, smtp: SMTP) -> None:
        self.smtp = smtp
        self.sent = 0
        self.idle_since = 0.0

    @property
    def reused(self) -> bool:
        return self.sent > 0


class SmtpSessions:
    """The adapter's SMTP sessions in one event loop: at most ``max_connections`` open, idle
    ones kept for ``idle_seconds`` when ``reuse_connections`` is on."""

    def __init__(self, settings: EmailSettings, local_hostname: str | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.settings = settings
        self.local_hostname = local_hostname
        self._slots = asyncio.Semaphore(settings.max_connections)
        self._idle: deque[SmtpSession] = deque()
        self._janitor: asyncio.Task[None] | None = None

    async def acquire(self) -> SmtpSession:
        """A connected, authenticated session (the most recently used idle one, or a new one).
        Holds a slot until :meth:`release`."""
        await self._slots.acquire()
        try:
            while self._idle:
                connection = self._idle.pop()
                if connection.smtp.is_connected and not self._expired(connection):
                    return connection
                connection.smtp.close()
            connection = SmtpSession(await self._open())
            return connection
        except BaseException:
            self._slots.release()
            raise

    async def reopen(self, connection: SmtpSession) -> None:
        """Replace a dead session by a new one, keeping the slot."""
        connection.smtp.close()
        connection.smtp = await self._open()
        connection.sent = 0

    def release(self, connection: SmtpSession, *, reusable: bool) -> None:
        """Give the slot back; keep the session for the next message when it is clean."""
        try:
            if (
                reusable
                and self.settings.reuse_connections
                and connection.smtp.is_connected
                and connection.sent < self.settings.max_messages_per_connection
            ):
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                if self._janitor is None or self._janitor.done():
                    self._janitor = self.loop.create_task(self._expire(), name="outbox-email-idle")
            else:
                connection.smtp.close()
        finally:
            self._slots.release()

    async def quit(self, connection: SmtpSession) -> None:
        """Say goodbye (QUIT) and close, ignoring a relay that does not answer."""
        try:
            await connection.smtp.quit(timeout=1.0)
        except Exception:
            pass
        finally:
            connection.smtp.close()

    async def aclose(self) -> None:
        idle = list(self._idle)
        self._idle.clear()
        await asyncio.gather(*(self.quit(connection) for connection in idle))
        if self._janitor is not None:
            self._janitor.cancel()
            await asyncio.gather(self._janitor, return_exceptions=True)

    def _expired(self, connection: SmtpSession) -> bool:
        return time.monotonic() - connection.idle_since >= self.settings.idle_seconds

    async def _expire(self) -> None:
        """Close idle sessions after ``idle_seconds``; all of them when the loop shuts down
        (the task is cancelled then), so no socket outlives its event loop."""
        try:
            while self._idle:
                oldest = self._idle[0]
                wait = oldest.idle_since + self.settings.idle_seconds - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                self._idle.popleft()
                await self.quit(oldest)
        finally:
            while self._idle:
                self._idle.pop().smtp.close()

    async def _open(self) -> SMTP:
        settings = self.settings
        if self.local_hostname is None:
            self.local_hostname = await asyncio.to_thread(socket.getfqdn)
        smtp: SMTP = smtp_library().SMTP(
            hostname=settings.host,
            port=settings.effective_port,
            use_tls=settings.tls == "implicit",
            start_tls=settings.tls == "starttls",
            username=settings.username,
            password=None if settings.password is None else settings.password.get_secret_value(),
            local_hostname=self.local_hostname,
            timeout=settings.command_timeout_seconds,
            validate_certs=settings.validate_certs,
            cert_bundle=settings.cert_bundle,
        )
        await smtp.connect(timeout=settings.connect_timeout_seconds)
        return smtp
