"""A provider on loopback for the conformance suite's own tests: an HTTP server that records
effects by idempotency key, reads them back, and fails its next write on demand, and the
fixture adapters (sound and deliberately broken) that call it over plain HTTP/1.0."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections import Counter
from typing import Any, ClassVar

from pydantic import BaseModel

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    Cancelled,
    Done,
    Failed,
    Reread,
    Retry,
    StopReason,
)
from outbox_core.observability import action_event
from outbox_core.testing.conformance import ConformanceTarget, Fault
from outbox_core.testing.database import OutboxTestDatabase


class LoopbackServer:
    """``POST /effects`` (header ``X-Key``) records one effect, ``GET /effects`` (same header)
    answers how many it holds, ``POST /model`` serves a call. ``fault()`` fails the next
    write: ``refuse`` (503, nothing recorded), ``drop`` (recorded, connection closed without a
    word), ``stall`` (recorded, no answer until the server stops); ``unreadable`` answers every
    ``GET`` with a 503 until ``clear_faults()`` (``unreadable_reads`` counts them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._requests = 0
        self._faults: list[Fault] = []
        self._unreadable = False
        self.unreadable_reads = 0
        self._stopping = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                server._count()
                if server._refuse_read():
                    self._answer(503, b"unavailable")
                    return
                self._answer(200, str(server.held(self.headers["X-Key"])).encode())

            def do_POST(self) -> None:
                server._count()
                fault = server._take()
                if fault == "refuse":
                    self._answer(503, b"busy")
                    return
                server._record(self.headers["X-Key"])
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault == "stall":
                    server._stopping.wait(3600)
                    return
                self._answer(200, b"ok")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _count(self) -> None:
        with self._lock:
            self._requests += 1

    def _refuse_read(self) -> bool:
        with self._lock:
            if self._unreadable:
                self.unreadable_reads += 1
            return self._unreadable

    def _take(self) -> Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _record(self, key: str) -> None:
        with self._lock:
            self._held[key] += 1

    def held(self, key: str) -> int:
        with self._lock:
            return self._held[key]

    # -- LoopbackProvider ----------------------------------------------------------------------

    def requests(self) -> int:
        with self._lock:
            return self._requests

    def writes(self, request: ActionRequest) -> int:
        return self.held(request.idempotency_key)

    def fault(self, fault: Fault) -> None:
        with self._lock:
            if fault == "unreadable":
                self._unreadable = True
            else:
                self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._unreadable = False


class Note(BaseModel):
    text: str


class LooseNote(BaseModel):
    text: Any = None


class LoopbackAdapter(ActionAdapter):
    """A sound read-back kind: reads back when an earlier write may have started, fences, POSTs;
    a 503 is a Retry, a lost answer raises (the executor makes it a Reread)."""

    kind = "TEST_LOOPBACK"
    instance_level = True
    provider_timeout_seconds: float | None = 1.0
    port: ClassVar[int] = 0
    path: ClassVar[str] = "/effects"

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Note)

    async def call(self, method: str, attempt: ActionAttempt, path: str | None = None) -> int:
        """One HTTP/1.0 request; the status, or an exception when the answer is lost."""
        timeout = self.provider_timeout_seconds or 1.0
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                head = (
                    f"{method} {path or self.path} HTTP/1.0\r\nX-Key: {attempt.idempotency_key}\r\n"
                    "Content-Length: 0\r\n\r\n"
                )
                writer.write(head.encode())
                await writer.drain()
                status = await reader.readline()
                if not status:
                    raise ConnectionError("the provider closed the connection without an answer")
                body = (await reader.read()).split(b"\r\n\r\n", 1)[-1]
                self.last_body = body
                return int(status.split()[1])
            finally:
                writer.close()

    async def held(self, attempt: ActionAttempt) -> bool | Reread:
        """Whether the provider holds the action's effect; a Reread when it cannot be read."""
        status = await self.call("GET", attempt)
        if status != 200:
            return Reread(detail=f"GET /effects HTTP {status}: not read")
        return int(self.last_body or b"0") > 0

    async def write(self, attempt: ActionAttempt) -> AdapterResult:
        status = await self.call("POST", attempt)
        if status == 503:
            return Retry(detail="POST /effects HTTP 503")
        return Done(f"effect-{attempt.id}")

    async def read_back(self, attempt: ActionAttempt) -> AdapterResult | None:
        """Done when the provider holds the effect, a Reread when it cannot be read, None when
        it holds nothing."""
        held = await self.held(attempt)
        if isinstance(held, Reread):
            return held
        return Done(f"effect-{attempt.id}") if held else None

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started and (found := await self.read_back(attempt)) is not None:
            return found
        if not await attempt.fence().begin_write():
            return Abandoned()
        return await self.write(attempt)


class LoopbackOnceAdapter(LoopbackAdapter):
    """A sound at-most-once kind: cannot read back; a lost answer raises (UNCERTAIN)."""

    kind = "TEST_LOOPBACK_ONCE"
    at_most_once = True

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return await self.write(attempt)


class LoopbackReadOnlyAdapter(LoopbackAdapter):
    """A sound read-back kind that only reads after an unknown write: what it does not find is
    ABSENT, never written then (as SLACK_POST)."""

    kind = "TEST_LOOPBACK_READ_ONLY"
    writes_again_when_absent = False

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            found = await self.read_back(attempt)
            return found or Cancelled(StopReason.ABSENT, detail="not held by the provider")
        if not await attempt.fence().begin_write():
            return Abandoned()
        return await self.write(attempt)


class LoopbackDraftAdapter(LoopbackAdapter):
    """A sound kind that writes nothing outside: one model call, its answer kept under the
    lease in attempt.transaction(), no fence."""

    kind = "TEST_LOOPBACK_DRAFT"
    writes_outside = False
    path = "/model"

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        result = await self.write(attempt)
        async with attempt.transaction() as conn:
            await conn.execute("SELECT 1")  # where a draft keeps its answer
        return result


# -- broken adapters: each breaks one rule ---------------------------------------------------


class WritesBeforeTheFence(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        result = await self.write(attempt)
        if not await attempt.fence().begin_write():
            return Abandoned()
        return result


class IgnoresARefusedFence(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        await attempt.fence().begin_write()
        return await self.write(attempt)


class FailsOnAnExceptionAtTheFence(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        try:
            if not await attempt.fence().begin_write():
                return Abandoned()
        except Exception:
            return Failed()
        return await self.write(attempt)


class RetriesALostAnswer(LoopbackAdapter):
    async def write(self, attempt: ActionAttempt) -> AdapterResult:
        try:
            return await super().write(attempt)
        except (OSError, TimeoutError):
            return Retry()


class OnceRetriesALostAnswer(RetriesALostAnswer, LoopbackOnceAdapter):
    """At most once, and yet a lost answer after the fence is retried: a second email."""


class NeverReadsBack(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return await self.write(attempt)


class WritesAgainDespiteDeclaring(LoopbackAdapter):
    """Declares that it only reads after an unknown write, and writes again all the same."""

    writes_again_when_absent = False


class FencesBeforeReadingBack(LoopbackAdapter):
    """Calls begin_write() before it reads back: every Reread of an outage counts an attempt."""

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        if attempt.write_started and (found := await self.read_back(attempt)) is not None:
            return found
        return await self.write(attempt)


class RereadsWithoutADetail(LoopbackAdapter):
    async def held(self, attempt: ActionAttempt) -> bool | Reread:
        held = await super().held(attempt)
        return Reread() if isinstance(held, Reread) else held


class UndeclaredStopReason(LoopbackAdapter):
    async def write(self, attempt: ActionAttempt) -> AdapterResult:
        result = await super().write(attempt)
        return Failed("PROVIDER_SAID_NO") if isinstance(result, Retry) else result


class AcceptsAnyPayload(LoopbackAdapter):
    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(LooseNote)


class EndedCallsTheProvider(LoopbackAdapter):
    async def ended(self, conn: Any, action: Any) -> None:
        await asyncio.to_thread(_get, self.port, action.idempotency_key)


class EndedKnowsOnlyTheExecutorsEndings(LoopbackAdapter):
    """Its ``ended`` refuses an ending it did not expect: an operator's resolution."""

    async def ended(self, conn: Any, action: Any) -> None:
        if str(action.stop_reason).startswith("RESOLVED_"):
            raise ValueError(f"unexpected stop reason {action.stop_reason}")


class CallsInsideTheTransaction(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        async with attempt.transaction():
            return await self.write(attempt)


class DeclaresNoTimeout(LoopbackAdapter):
    provider_timeout_seconds = None


class TimesOutAfterTheMargin(LoopbackAdapter):
    provider_timeout_seconds = 90.0

    async def call(self, method: str, attempt: ActionAttempt, path: str | None = None) -> int:
        # It declares 90 s but uses 1 s, so the run itself stays short.
        declared, self.provider_timeout_seconds = self.provider_timeout_seconds, 1.0
        try:
            return await super().call(method, attempt, path)
        finally:
            self.provider_timeout_seconds = declared


class IgnoresItsTimeout(LoopbackAdapter):
    """Declares 1 s and waits an hour: only the executor's watchdog ends a stalled call."""

    async def call(self, method: str, attempt: ActionAttempt, path: str | None = None) -> int:
        declared, self.provider_timeout_seconds = self.provider_timeout_seconds, 3600.0
        try:
            return await super().call(method, attempt, path)
        finally:
            self.provider_timeout_seconds = declared


class LogsThePayload(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        action_event("test.loopback.sending", attempt.id, attempt.kind, text=attempt.payload)
        return await super().execute(attempt)


class DetailsThePayload(LoopbackAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        result = await super().execute(attempt)
        if isinstance(result, Done):
            return Done(result.readback_ref, detail=f"sent {attempt.payload}")
        return result


class DraftThatFences(LoopbackDraftAdapter):
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return await self.write(attempt)


def _get(port: int, key: str) -> None:
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/effects", headers={"X-Key": key}, method="GET"
    )
    with urllib.request.urlopen(request, timeout=2):
        pass


def target_for(
    db: OutboxTestDatabase,
    adapter: type[LoopbackAdapter],
    server: LoopbackServer,
    *,
    invalid_payloads: tuple[dict[str, Any], ...] = (),
) -> ConformanceTarget:
    """``adapter`` registered alone in ``db``, pointed at ``server``."""
    from outbox_core import KindRegistry

    adapter.port = server.port
    db.registry = KindRegistry()
    db.register_kind(adapter)
    return ConformanceTarget(
        db=db,
        kind=adapter.kind,
        provider=server,
        request=lambda key, canary: ActionRequest(
            adapter.kind, "loopback", key, payload={"text": canary}
        ),
        invalid_payloads=invalid_payloads,
    )
