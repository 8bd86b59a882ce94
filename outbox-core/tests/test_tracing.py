"""OpenTelemetry traces: one trace from the span that enqueued to each attempt's span, with the
fence, the outcome and a reread as events, and never a payload value anywhere in a span."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Done,
    Reread,
    Retry,
)
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter

CANARY = "canary-7f3a9c"


def _reset_tracer_provider() -> None:
    # The API sets its global provider once per process; the tests set and unset their own.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@contextmanager
def memory_tracing() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider, global while the block runs, exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
        _reset_tracer_provider()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider, global for the test, exporting to memory."""
    with memory_tracing() as (_, exporter):
        yield exporter


def attempt_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("outbox.execute")]


def enqueue_in_span(db: OutboxTestDatabase, kind: str, key: str, **payload: Any) -> Any:
    """Enqueue inside an application span; that span's context."""
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("POST /orders") as span, db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest(kind, "lane", key, payload=payload))
        conn.commit()
    return span.get_span_context()


def scripted(*results: AdapterResult) -> None:
    remaining = list(results)

    async def script(attempt: ActionAttempt) -> AdapterResult:
        result = remaining.pop(0)
        if isinstance(result, Reread | Done) and not await attempt.fence().begin_write():
            return Abandoned()
        return result

    ScriptedAdapter.script = script


def test_the_attempt_span_is_a_child_of_the_enqueuing_span_and_links_to_it(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    scripted(Done("ref"))
    parent = enqueue_in_span(db, "TEST_SCRIPTED", "k")
    db.drain()
    (span,) = attempt_spans(spans)
    assert span.name == "outbox.execute TEST_SCRIPTED"
    assert span.kind == SpanKind.CONSUMER
    assert span.context.trace_id == parent.trace_id
    assert span.parent is not None and span.parent.span_id == parent.span_id
    assert [link.context.span_id for link in span.links] == [parent.span_id]
    action_id = db.scalar("SELECT id FROM {schema}.agent_action")
    assert dict(span.attributes or {}) == {
        "messaging.system": "outbox",
        "messaging.operation.type": "process",
        "messaging.operation.name": "execute",
        "messaging.destination.name": "TEST_SCRIPTED",
        "messaging.message.id": str(action_id),
    }
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        ("outbox.fence", {"outbox.fence.answer": "passed"}),
        (
            "outbox.ending",
            {
                "outbox.result": "Done",
                "outbox.action.state": "DONE",
                "outbox.stop_reason": "COMPLETED",
            },
        ),
    ]


def test_a_retry_is_a_second_attempt_span_in_the_same_trace(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    scripted(Retry(timedelta(seconds=30)), Done())
    parent = enqueue_in_span(db, "TEST_SCRIPTED", "k")
    db.drain()
    db.drain()  # the retry is due again
    first, second = attempt_spans(spans)
    assert {first.context.trace_id, second.context.trace_id} == {parent.trace_id}
    assert first.context.span_id != second.context.span_id
    assert [s.events[-1].attributes["outbox.result"] for s in (first, second)] == [  # type: ignore[index]
        "Retry",
        "Done",
    ]
    (rescheduled,) = first.events
    assert rescheduled.name == "outbox.rescheduled"
    assert rescheduled.attributes["outbox.action.state"] == "ADMITTED"  # type: ignore[index]


def test_a_reread_is_an_event_and_the_reading_attempt_joins_the_trace(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    scripted(Reread(timedelta(seconds=30)), Done())
    parent = enqueue_in_span(db, "TEST_SCRIPTED", "k")
    db.drain()
    db.drain()  # the Reread's lease runs out: the next attempt reads back
    first, second = attempt_spans(spans)
    assert second.context.trace_id == parent.trace_id
    assert [e.name for e in first.events] == ["outbox.fence", "outbox.reread"]
    assert [e.name for e in second.events][-1] == "outbox.ending"


def test_an_attempt_that_raises_names_the_error_by_its_type_only(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    async def script(attempt: ActionAttempt) -> AdapterResult:
        raise RuntimeError(f"provider said no to {attempt.payload['note']}")

    ScriptedAdapter.script = script
    enqueue_in_span(db, "TEST_SCRIPTED", "k", note=CANARY)
    db.drain(max_attempts=1)
    span = attempt_spans(spans)[0]
    assert span.attributes is not None
    assert span.attributes["error.type"] == "RuntimeError"
    assert span.status.status_code == StatusCode.ERROR


def test_no_payload_value_reaches_any_span_event_or_link(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    calls = 0

    async def script(attempt: ActionAttempt) -> AdapterResult:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError(f"refused {attempt.payload['note']}")
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Done(f"ref-{attempt.id}")

    ScriptedAdapter.script = script
    enqueue_in_span(db, "TEST_SCRIPTED", "k", note=CANARY)
    db.drain()
    db.drain()
    found = attempt_spans(spans)
    assert len(found) == 2
    for span in spans.get_finished_spans():
        text = repr(
            (
                span.name,
                dict(span.attributes or {}),
                [(e.name, dict(e.attributes or {})) for e in span.events],
                [dict(link.attributes or {}) for link in span.links],
                span.status.description,
            )
        )
        assert CANARY not in text


def test_the_trace_context_is_stored_beside_the_payload_only_when_a_span_is_active(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    parent = enqueue_in_span(db, "TEST_SCRIPTED", "traced", note="n")
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "untraced"))
        conn.commit()
    rows = dict(
        db.rows("SELECT idempotency_key, trace_context FROM {schema}.agent_action ORDER BY id")
    )
    assert rows["untraced"] is None
    assert rows["traced"] == {
        "traceparent": f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{int(parent.trace_flags):02x}"
    }
    assert db.rows(
        "SELECT payload FROM {schema}.agent_action WHERE idempotency_key = 'traced'"
    ) == [({"note": "n"},)]


def test_enqueue_many_stores_each_requests_trace_context(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    with db.connect() as conn:
        db.outbox.enqueue_many(conn, [ActionRequest("TEST_SCRIPTED", "lane", "untraced")])
        with trace.get_tracer("app").start_as_current_span("batch") as span:
            db.outbox.enqueue_many(
                conn, [ActionRequest("TEST_SCRIPTED", "lane", f"traced-{n}") for n in range(2)]
            )
        conn.commit()
    contexts = db.rows("SELECT trace_context FROM {schema}.agent_action ORDER BY id")
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert contexts[0] == (None,)
    assert all(trace_id in row[0]["traceparent"] for row in contexts[1:])


async def test_without_a_tracer_provider_no_span_is_made_and_no_context_read(
    db: OutboxTestDatabase,
) -> None:
    scripted(Done())
    _reset_tracer_provider()
    async with await db.aconnect() as conn:
        await db.outbox.aenqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        await conn.commit()
    async with db.executor() as executor:
        assert await executor.drain() > 0
        assert executor.attempts.traces.batcher._task is None  # never started: nothing read
    assert db.scalar("SELECT trace_context FROM {schema}.agent_action") is None


def test_a_provider_clients_span_nests_under_the_attempt_span(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    async def script(attempt: ActionAttempt) -> AdapterResult:
        # What an instrumented HTTP or SMTP client does: a span in the current context.
        with trace.get_tracer("httpx").start_as_current_span("POST"):
            return Done()

    ScriptedAdapter.script = script
    enqueue_in_span(db, "TEST_SCRIPTED", "k")
    db.drain()
    (client,) = [s for s in spans.get_finished_spans() if s.name == "POST"]
    (attempt,) = attempt_spans(spans)
    assert client.parent is not None and client.parent.span_id == attempt.context.span_id


async def test_an_action_enqueued_without_a_span_gets_root_attempt_spans(
    db: OutboxTestDatabase, spans: InMemorySpanExporter
) -> None:
    scripted(Done())
    async with await db.aconnect() as conn:
        await db.outbox.aenqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        await conn.commit()
    # An executor started inside some span of the application: its attempts are not its
    # children (only the span that enqueued is a parent).
    with trace.get_tracer("app").start_as_current_span("startup"):
        async with db.executor() as executor:
            await executor.drain()
    (span,) = attempt_spans(spans)
    assert span.parent is None and span.links == ()


@pytest.mark.parametrize("stored", ["[1, 2]", '{"traceparent": 7}', '"text"'])
def test_a_stored_context_that_is_not_a_string_map_never_stops_the_attempt(
    db: OutboxTestDatabase,
    spans: InMemorySpanExporter,
    stored: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row written by hand (or by another tool) with a context that does not parse: the
    attempt runs and ends, with or without a span, and never holds its kind's slot unended."""
    scripted(Done())
    enqueue_in_span(db, "TEST_SCRIPTED", "k")
    with db.connect() as conn:
        conn.execute(f"UPDATE {db.schema}.agent_action SET trace_context = %s::jsonb", (stored,))
        conn.commit()
    db.drain()
    assert db.rows("SELECT state FROM {schema}.agent_action") == [("DONE",)]
