"""The base of the packages' loopback HTTP fakes (outbox-draft's model server, outbox-issues'
GitHub, outbox-slack's Slack): what every one of them does the same way, so that each fake
holds only its provider's routes and the shapes of its answers and errors.

- :class:`LoopbackHTTPServer`: listens on an ephemeral port of ``127.0.0.1`` in a thread
  (:meth:`~LoopbackHTTPServer.start`, :meth:`~LoopbackHTTPServer.stop`, a context manager),
  records every request it receives (:attr:`~LoopbackHTTPServer.received`), answers each with
  the subclass's :meth:`~LoopbackHTTPServer.serve`, can refuse connections on its port and take
  them again, and lets a test wait until a condition on it holds
  (:meth:`~LoopbackHTTPServer.wait_until`).
- :class:`Exchange`: one request's connection: send an answer, or drop the connection without
  one (after a write was accepted, or before).
- :class:`Answer`: raised anywhere in :meth:`~LoopbackHTTPServer.serve` to answer now with a
  status, body and headers (a provider's error shape, a redirect).
- :class:`Gate`: what a stall or a hold waits on; :meth:`~LoopbackHTTPServer.stop` opens them.

The fault switches (a fault per operation for the next ``times`` requests, an outage for some
seconds, new writes hidden for a while) are in :mod:`outbox_core.testing.faults`.

The foundation is the standard library's ``ThreadingHTTPServer`` (a thread per connection),
not aiohttp: outbox-core has no HTTP dependency and outbox-draft and outbox-issues promise
that their fakes need only the standard library; a server in its own threads serves sync
tests (``outbox_db.drain()``) and async clients alike; a stall is a blocking wait that
:meth:`~LoopbackHTTPServer.stop` ends, and a drop is a socket shut down under the client.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

__all__ = ["JSON", "Answer", "Exchange", "Gate", "LoopbackHTTPServer", "Received"]

JSON = "application/json"


@dataclass(frozen=True)
class Received:
    """One request the server received, before anything was answered."""

    method: str
    target: str
    """The request target as sent: the path with its query string."""
    headers: dict[str, str]
    """The request's headers, their names lower-cased."""
    raw: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        """The query string's parameters (the last value of a repeated one)."""
        return {key: values[-1] for key, values in parse_qs(urlsplit(self.target).query).items()}

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def json(self) -> Any:
        """The body as JSON (None when empty); ValueError when it is not JSON."""
        return json.loads(self.raw) if self.raw else None


class Answer(Exception):
    """Answer the request now with ``status``, ``body`` (JSON unless bytes or text, nothing
    when None) and ``headers``; raise it from anywhere under :meth:`LoopbackHTTPServer.serve`."""

    def __init__(
        self,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        content_type: str | None = None,
    ) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.content_type = content_type


class Gate:
    """What stalls and holds wait on: :meth:`wait` returns at once while the gate is open."""

    def __init__(self, *, open: bool) -> None:
        self._event = threading.Event()
        if open:
            self._event.set()

    def open(self) -> None:
        self._event.set()

    def close(self) -> None:
        self._event.clear()

    @property
    def is_open(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait until the gate opens, at most ``seconds``; True when it opened."""
        return self._event.wait(seconds)


class Exchange:
    """One request's connection, as :meth:`LoopbackHTTPServer.serve` answers it."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        self.answered = False

    def send(
        self,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        content_type: str | None = None,
    ) -> None:
        """Answer ``status`` with ``body`` (JSON unless bytes or text; None: no body) and
        ``headers`` after the server's :meth:`~LoopbackHTTPServer.answer_headers`, which they
        override (names compared without case)."""
        server = self._handler.loopback
        if body is None:
            data = b""
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        given = headers or {}
        overridden = {name.lower() for name in given}
        chosen = {
            name: value
            for name, value in server.answer_headers(self._handler.path).items()
            if name.lower() not in overridden
        }
        chosen.update(given)
        if body is not None and "content-type" not in {name.lower() for name in chosen}:
            chosen["content-type"] = content_type or server.json_content_type
        chosen["content-length"] = str(len(data))
        self.answered = True
        self._handler.send_response(status)
        for name, value in chosen.items():
            self._handler.send_header(name, value)
        self._handler.end_headers()
        if data:
            with contextlib.suppress(OSError):
                self._handler.wfile.write(data)

    def drop(self) -> None:
        """Close the connection without an answer (the client sees it cut)."""
        self.answered = True
        self._handler.close_connection = True
        with contextlib.suppress(OSError):
            self._handler.connection.shutdown(socket.SHUT_RDWR)


class LoopbackHTTPServer:
    """A server on ``127.0.0.1``; subclasses answer in :meth:`serve`.

    Use it as a context manager, or :meth:`start` and :meth:`stop`. Every request is recorded
    in :attr:`received` (under :attr:`lock`) before :meth:`serve` sees it.
    """

    thread_name = "loopback-http"
    server_version = "loopback"
    json_content_type = JSON
    """The content type of a JSON answer."""

    def __init__(self, *, stall_seconds: float = 30.0) -> None:
        self.stall_seconds = stall_seconds
        """The longest a stall or a hold waits when nothing ends it."""
        self.lock = threading.RLock()
        self.received: list[Received] = []
        self.refusing = False
        """True while :meth:`refuse_connections` keeps the door shut."""
        self._gates: list[Gate] = []
        self.stalls = self.gate(open=False)
        """What a stall waits on: opened by :meth:`release` (and :meth:`stop`)."""
        self._changed = threading.Condition(self.lock)
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._port = 0

    # -- what a subclass gives -----------------------------------------------------------------

    def serve(self, request: Received, exchange: Exchange) -> None:
        """Answer ``request`` on ``exchange`` (or raise :class:`Answer`)."""
        raise NotImplementedError

    def answer_headers(self, path: str) -> dict[str, str]:
        """Headers every answer carries unless it names them itself (none by default)."""
        return {}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        self._listen(0)
        return self

    def stop(self) -> None:
        for gate in self._gates:
            gate.open()
        self.refusing = False
        self._close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._port, "start the server first"
        return self._port

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> None:
        server = self

        class Handler(_Handler):
            loopback = server
            server_version = server.server_version

        try:
            httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise RuntimeError(
                f"{type(self).__name__} could not listen on 127.0.0.1:{port} again ({exc}): "
                "another process took the port while its connections were refused"
            ) from exc
        httpd.daemon_threads = True
        self._httpd = httpd
        self._port = int(httpd.server_address[1])
        threading.Thread(target=httpd.serve_forever, name=self.thread_name, daemon=True).start()

    def _close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def refuse_connections(self) -> None:
        """The server is unreachable: its listening socket closes (a connection is refused
        before any request is sent, so nothing of it is recorded) and its open connections are
        cut, until :meth:`accept_connections` listens on the same port again."""
        if self._port == 0 or self.refusing:
            return
        self.refusing = True
        self._close()
        with self.lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def accept_connections(self) -> None:
        """Listen again (on the same port) after :meth:`refuse_connections`."""
        if self.refusing:
            self._listen(self._port)
            self.refusing = False

    # -- stalls, holds and waiting -------------------------------------------------------------

    def gate(self, *, open: bool) -> Gate:
        """A new gate that :meth:`stop` opens (so no request waits past the server)."""
        made = Gate(open=open)
        self._gates.append(made)
        return made

    def release(self) -> None:
        """End every stall now (and those to come, until :meth:`rearm`)."""
        self.stalls.open()

    def rearm(self) -> None:
        """Stalls wait again (after :meth:`release`)."""
        self.stalls.close()

    def stall_here(self, seconds: float | None = None) -> None:
        """Wait ``seconds`` (the server's :attr:`stall_seconds` by default), or until
        :meth:`release`."""
        self.stalls.wait(self.stall_seconds if seconds is None else seconds)

    def changed(self) -> None:
        """Wake :meth:`wait_until` (call it when state that tests wait on changes)."""
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, condition: Callable[[Self], bool], timeout: float = 30.0) -> bool:
        """Wait until ``condition(server)`` holds (checked whenever a request arrives and
        whenever :meth:`changed` is called); False when ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)

    # -- one request ---------------------------------------------------------------------------

    def _receive(self, request: Received, exchange: Exchange) -> None:
        with self._changed:
            self.received.append(request)
            self._changed.notify_all()
        try:
            self.serve(request, exchange)
        except Answer as answer:
            exchange.send(
                answer.status, answer.body, answer.headers, content_type=answer.content_type
            )


class _Handler(BaseHTTPRequestHandler):
    loopback: LoopbackHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.loopback.lock:
            self.loopback._connections.add(self.connection)

    def finish(self) -> None:
        with self.loopback.lock:
            self.loopback._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Received(self.command, self.path, headers, raw)
        self.loopback._receive(request, Exchange(self))
