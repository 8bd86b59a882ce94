"""A TCP proxy in front of the test PostgreSQL that can lose a reply: once armed with a pattern,
the first statement whose bytes hold it is passed to the server, which runs (and, in
autocommit, commits) it, and the connection is cut when the server's answer comes back, before
the client reads it. What a failover or a proxy's timeout does to a client at the worst
moment.

Armed with ``hold=True``, the proxy keeps the client's connection open instead, its answer
discarded, until the server closes its side: a client whose statement committed on a primary
that then failed over learns nothing until the primary is gone, and asks the new one. Put one
proxy in front of each node and name them all in a multi-host URL (:attr:`conninfo` of each, or
``host=127.0.0.1,127.0.0.1 port=P1,P2``). :meth:`ReplyLosingProxy.lose_statement` is the
other case: the statement never reaches the server, and the client is held the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["ReplyLosingProxy"]


class ReplyLosingProxy:
    def __init__(self, upstream: str, port: int = 0) -> None:
        self._upstream = conninfo_to_dict(upstream)
        self._port = port
        self._pattern: bytes | None = None
        self._hold = False
        self._drop = False
        self.lost = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def lose_reply_to(self, pattern: bytes, *, hold: bool = False) -> None:
        """Lose the answer of the next statement that holds ``pattern`` (once); with ``hold``,
        the client waits, answered nothing, until the server closes the connection."""
        self._pattern, self._hold = pattern, hold
        self._drop = False

    def lose_statement(self, pattern: bytes) -> None:
        """Never pass on the next statement that holds ``pattern`` (once): it does not run, and
        the client waits, answered nothing, until the server closes the connection."""
        self._pattern, self._hold, self._drop = pattern, True, True

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def conninfo(self) -> str:
        """The upstream database, reached through this proxy."""
        params: dict[str, Any] = {
            **self._upstream,
            "host": "127.0.0.1",
            "port": self.port,
            "sslmode": "disable",
            "gssencmode": "disable",
        }
        return make_conninfo(**params)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = str(self._upstream.get("host") or "127.0.0.1")
        port = int(self._upstream.get("port") or 5432)
        if host.startswith("/"):
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._open_upstream()
        armed = asyncio.Event()
        hold = False

        async def client_to_server() -> None:
            nonlocal hold
            dropping = False
            while chunk := await reader.read(65536):
                if self._pattern is not None and self._pattern in chunk:
                    self._pattern = None
                    hold = self._hold
                    if self._drop:
                        self.lost += 1
                        dropping = True  # this statement and whatever the client sends next
                    else:
                        armed.set()
                if dropping:
                    continue
                up_writer.write(chunk)
                await up_writer.drain()

        async def server_to_client() -> None:
            # Backend messages: a type byte and a length that counts itself (no TLS or GSS
            # negotiation: the proxy's conninfo disables both, so the stream is all messages).
            completed = False
            while True:
                head = await up_reader.readexactly(5)
                body = await up_reader.readexactly(int.from_bytes(head[1:5], "big") - 4)
                kind = head[:1]
                if armed.is_set():
                    completed = completed or kind == b"C"
                    if kind == b"Z" and completed:
                        # ReadyForQuery after CommandComplete: in autocommit the statement has
                        # committed; cut before the client reads its answer.
                        self.lost += 1
                        if hold:  # or answer nothing more until the server closes
                            while await up_reader.read(65536):
                                pass
                        return
                writer.write(head + body)
                if kind == b"Z":
                    await writer.drain()

        pumps = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for end in (writer, up_writer):
                end.close()
                with contextlib.suppress(Exception):
                    await end.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReplyLosingProxy]:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        try:
            yield self
        finally:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
