"""Traces that cost little (issue 34): the claim returns each action's stored trace context
with its row (no statement of its own), and a span that the sampler drops builds no attribute,
link or event."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind
from opentelemetry.util.types import Attributes
from psycopg import AsyncCursor

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .test_tracing import _reset_tracer_provider, attempt_spans, memory_tracing, scripted

# A stored context of a sampled parent (W3C's example).
STORED = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every statement the executor's connections run (the first line of the text
    sent, ``-- claim``, ...): AsyncCursor.execute, which AsyncConnection.execute calls, counted
    on the real connection."""
    seen: list[str] = []
    original = AsyncCursor.execute

    async def counted(self: AsyncCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else repr(query)
        seen.append(text.split("\n", 1)[0])
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(AsyncCursor, "execute", counted)
    return seen


def enqueue_each_in_its_span(
    db: OutboxTestDatabase, keys: Sequence[tuple[str, str]]
) -> dict[str, int]:
    """Enqueue each (lane, key) inside a span of its own; each key's span id."""
    parents = {}
    for lane, key in keys:
        tracer = trace.get_tracer("app")
        with tracer.start_as_current_span(f"request {key}") as span, db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", lane, key))
            conn.commit()
        parents[key] = span.get_span_context().span_id
    return parents


def parents_by_key(db: OutboxTestDatabase, found: list[ReadableSpan]) -> dict[str, int | None]:
    keys = dict(db.rows("SELECT id::text, idempotency_key FROM {schema}.agent_action"))
    return {
        keys[str(s.attributes["messaging.message.id"])]: s.parent.span_id if s.parent else None  # type: ignore[index]
        for s in found
    }


async def test_the_claim_returns_the_stored_context_and_no_statement_reads_it(
    db: OutboxTestDatabase, statements: list[str]
) -> None:
    """Claimed heads and the heads the settle chained (two actions in a lane) each get their
    stored context as parent, and the executor never runs the read of stored contexts."""
    scripted(*[Done() for _ in range(6)])
    keys = [("lane-a", "a1"), ("lane-a", "a2"), ("lane-b", "b1"), ("lane-b", "b2"), ("c", "c1")]
    with memory_tracing() as (_, exporter):
        parents = enqueue_each_in_its_span(db, keys)
        async with db.executor() as executor:
            chained: list[tuple[Any, ...]] = []
            forward = executor.endings._chained
            executor.endings._chained = lambda rows: (chained.extend(rows), forward(rows))[1]
            assert await executor.drain() == len(keys)
        found = attempt_spans(exporter)
    assert parents_by_key(db, found) == parents
    # The second action of each two-action lane came with its predecessor's settle, context
    # included.
    assert sorted(row[5] for row in chained) == ["a2", "b2"]
    assert all(row[16] for row in chained)
    assert "-- claim" in statements
    assert "-- trace_contexts" not in statements


async def test_without_a_provider_the_claim_returns_no_context(db: OutboxTestDatabase) -> None:
    """The claim's context column is left NULL while tracing is off: not even the probe of
    the stored context runs (a context is stored here, by hand)."""
    scripted(Done())
    _reset_tracer_provider()
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        conn.execute(f"UPDATE {db.schema}.agent_action SET trace_context = %s::jsonb", (STORED,))
        conn.commit()
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        assert [(r[0], r[16]) for r in rows] == [("claim", None)]
        await _run(executor, rows)
    assert db.rows("SELECT state FROM {schema}.agent_action") == [("DONE",)]


async def _run(executor: Any, rows: list[tuple[Any, ...]]) -> None:
    await asyncio.gather(*executor.attempts.dispatch(rows))


async def test_a_context_the_claim_did_not_return_is_read_before_the_attempt(
    db: OutboxTestDatabase, statements: list[str]
) -> None:
    """Tracing turned on after the claim (the claim's column NULL): the attempt reads the
    stored context and still joins the enqueuing trace."""
    scripted(Done())
    with memory_tracing() as (provider, exporter):
        (parent,) = enqueue_each_in_its_span(db, [("lane", "k")]).values()
        _reset_tracer_provider()  # off for the claim
        async with db.executor() as executor:
            rows, _ = await executor.claims.claim(10)
            assert [(r[0], r[16]) for r in rows] == [("claim", None)]
            trace.set_tracer_provider(provider)  # on for the attempt
            await _run(executor, rows)
        (span,) = attempt_spans(exporter)
    assert span.parent is not None and span.parent.span_id == parent
    assert statements.count("-- trace_contexts") == 1


# -- a span the sampler drops ---------------------------------------------------------------


class DroppedSpan(NonRecordingSpan):
    """A span that does not record, and remembers every call that would build something."""

    def __init__(self, context: trace.SpanContext) -> None:
        super().__init__(context)
        self.built: list[str] = []
        self.ended = 0

    def set_attribute(self, key: str, value: Any) -> None:
        self.built.append(f"attribute {key}")

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.built.append(f"attributes {sorted(attributes)}")

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        self.built.append(f"event {name}")

    def add_link(self, context: trace.SpanContext, attributes: Attributes = None) -> None:
        self.built.append("link")

    def set_status(self, status: Any, description: str | None = None) -> None:
        self.built.append("status")

    def end(self, end_time: int | None = None) -> None:
        self.ended += 1


class DroppingTracer(trace.Tracer):
    """A tracer whose sampler drops every span: what each start was given, and the spans."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, dict[str, Any], list[Link]]] = []
        self.spans: list[DroppedSpan] = []

    def start_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        **_: Any,
    ) -> DroppedSpan:
        self.starts.append((name, dict(attributes or {}), list(links or ())))
        span = DroppedSpan(trace.get_current_span(context).get_span_context())
        self.spans.append(span)
        return span

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class DroppingProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self.tracer = DroppingTracer()

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return self.tracer


def test_a_dropped_span_builds_no_attribute_link_or_event(db: OutboxTestDatabase) -> None:
    """Only the kind's constant sampling attributes (made once per kind) reach the start; the
    action's id, the link to the enqueuing span, the fence's and the outcome's events and the
    status are built only on a span that records. The span is still ended."""
    scripted(Done("ref"))
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        unsampled = STORED.replace("-01", "-00")
        conn.execute(f"UPDATE {db.schema}.agent_action SET trace_context = %s::jsonb", (unsampled,))
        conn.commit()
    provider = DroppingProvider()
    _reset_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        db.drain()
    finally:
        _reset_tracer_provider()
    tracer = provider.tracer
    assert tracer.starts == [
        (
            "outbox.execute TEST_SCRIPTED",
            {
                "messaging.system": "outbox",
                "messaging.operation.type": "process",
                "messaging.operation.name": "execute",
                "messaging.destination.name": "TEST_SCRIPTED",
            },
            [],
        )
    ]
    (span,) = tracer.spans
    assert span.built == []
    assert span.ended == 1
    assert db.rows("SELECT state FROM {schema}.agent_action") == [("DONE",)]


class RecordingDropSampler(Sampler):
    """Drops every span; remembers what it was asked with."""

    def __init__(self) -> None:
        self.asked: list[tuple[dict[str, Any], int]] = []

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        self.asked.append((dict(attributes or {}), len(links or ())))
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "RecordingDropSampler"


class StartedSpans(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[Span] = []

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self.started.append(span)


def test_with_the_sdk_a_dropped_span_reaches_no_processor_and_the_sampler_sees_no_action_id(
    db: OutboxTestDatabase,
) -> None:
    scripted(Done("ref"))
    sampler, started, exporter = RecordingDropSampler(), StartedSpans(), InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(started)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        with db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
            conn.commit()
        db.drain()
    finally:
        provider.shutdown()
        _reset_tracer_provider()
    ((attributes, links),) = sampler.asked
    assert "messaging.message.id" not in attributes and links == 0
    assert started.started == [] and exporter.get_finished_spans() == ()


def test_under_an_unsampled_parent_the_sdk_is_not_asked_and_a_clients_span_is_dropped_too(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's default sampler (ParentBased) drops a span whose stored parent was not
    sampled: the attempt makes none (the SDK's start_span is not called for it), and a
    provider client's span made during the attempt is in the parent's trace and dropped."""
    from opentelemetry.sdk.trace import Tracer as SdkTracer

    client: list[trace.SpanContext] = []

    async def script(attempt: ActionAttempt) -> AdapterResult:
        with trace.get_tracer("httpx").start_as_current_span("POST") as span:
            client.append(span.get_span_context())
        return Done()

    ScriptedAdapter.script = script
    starts: list[str] = []
    original = SdkTracer.start_span

    def counted(self: SdkTracer, name: str, *args: Any, **kwargs: Any) -> trace.Span:
        starts.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(SdkTracer, "start_span", counted)
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        conn.execute(
            f"UPDATE {db.schema}.agent_action SET trace_context = %s::jsonb",
            (STORED.replace("-01", "-00"),),
        )
        conn.commit()
    with memory_tracing() as (_, exporter):
        db.drain()
        assert exporter.get_finished_spans() == ()
    assert starts == ["POST"]
    (made,) = client
    assert f"{made.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert not made.trace_flags.sampled
    assert db.rows("SELECT state FROM {schema}.agent_action") == [("DONE",)]
