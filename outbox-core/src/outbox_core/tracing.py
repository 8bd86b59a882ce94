"""OpenTelemetry traces: one trace from the request that enqueued an action to its provider call.

At enqueue, when a span is active (the application's request, its job), its W3C trace context
(``traceparent``, ``tracestate``) is stored on the action, in ``agent_action.trace_context``:
never in the payload, so the kinds' variants never see it. Each attempt then runs in a span
``outbox.execute <kind>`` (kind CONSUMER) whose parent is that stored context and which also
links to it, as the messaging conventions ask of a consumer; the span is current while the
adapter runs, so an instrumented HTTP or SMTP client's spans nest under it. The write fence, the
ending and a reread are events on that span. Attributes name the action (id, kind, attempt,
epoch) and the result, never a payload value, nor an exception's message.

With no tracer provider configured (the OpenTelemetry API's default), none of this runs: enqueue
looks at the current span (a context variable read) and stores nothing when none is valid, and
the executor checks once per attempt whether a provider is set (see :func:`enabled`) and
otherwise neither reads the stored context nor makes a span. ``docs/tracing.md`` shows the set-up
and ``docs/benchmarks.md`` the cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import Token
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanKind,
    Status,
    StatusCode,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .states import ActionState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .claimed import ClaimedAction
    from .executor.outcomes import Ending

TRACER_NAME = "outbox"
MESSAGING_SYSTEM = "outbox"

_propagator = TraceContextTextMapPropagator()
Activation = Token[context.Context]
"""What :func:`activate` returns and :func:`deactivate` takes."""
_UNTRACED = (ProxyTracerProvider, NoOpTracerProvider)


# The event of an attempt's outcome, by the state it leaves the action in; any other state is
# an ending (DONE, FAILED, UNCERTAIN, CANCELLED).
_EVENTS = {
    # A Reread: still EXECUTING, with its fence; the next attempt reads back first.
    ActionState.EXECUTING: "outbox.reread",
    # A Retry or a Defer: ADMITTED again, due after the delay.
    ActionState.ADMITTED: "outbox.rescheduled",
}
_tracer: tuple[object, trace.Tracer] | None = None


def enabled() -> bool:
    """Whether the application configured a tracer provider (the API's default is a proxy that
    makes no-op spans until one is set)."""
    return not isinstance(trace.get_tracer_provider(), _UNTRACED)


def current_context() -> dict[str, str] | None:
    """The W3C trace context of the span active now, as the ``traceparent`` (and
    ``tracestate``) headers; None when no valid span is active. Baggage is left out on
    purpose: it is the application's, may hold anything, and is not needed to join a trace."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier or None


def start_attempt(claimed: ClaimedAction, stored: Mapping[str, Any] | None) -> Span:
    """Start the span of one attempt: child of the enqueuing span's stored context, linked to
    it; a root span when there is none, or it does not parse (never a child of whatever span
    was current where the executor's tasks were started)."""
    parent = _propagator.extract(dict(stored)) if stored else context.Context()
    parent_span = trace.get_current_span(parent).get_span_context()
    links = [Link(parent_span)] if parent_span.is_valid else None
    return _get_tracer().start_span(
        f"outbox.execute {claimed.kind}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "execute",
            "messaging.destination.name": claimed.kind,
            "messaging.message.id": str(claimed.id),
            "outbox.action.attempt": claimed.attempt,
            "outbox.action.epoch": claimed.epoch,
        },
    )


def _get_tracer() -> trace.Tracer:
    """The outbox's tracer of the configured provider, made once per provider."""
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(TRACER_NAME))
    return _tracer[1]


def activate(span: Span) -> Activation:
    """Make ``span`` the current span (of this task) until :func:`deactivate`."""
    return context.attach(trace.set_span_in_context(span))


def deactivate(activation: Activation) -> None:
    context.detach(activation)


def fence_event(span: Span, answer: str) -> None:
    """A write fence's answer (``passed``, ``moved``, ``short``) as an event."""
    span.add_event("outbox.fence", {"outbox.fence.answer": answer})


def end_attempt(
    span: Span, result: str, ending: Ending | None, error: BaseException | None = None
) -> None:
    """Record what the attempt decided and end its span. ``result`` is the counted result's
    name (``Done``, ``Retry (raised)``, ``Abandoned``, ...); ``ending`` the write it leads to
    (None: abandoned, nothing written); ``error`` what execute() raised, by its type only."""
    span.set_attribute("outbox.result", result)
    if error is not None:
        span.set_attribute("error.type", type(error).__qualname__)
    if ending is not None:
        attributes: dict[str, str | float] = {"outbox.action.state": str(ending.state)}
        if ending.stop_reason is not None:
            attributes["outbox.stop_reason"] = ending.stop_reason
        if ending.delay is not None:
            attributes["outbox.delay_seconds"] = ending.delay.total_seconds()
        span.add_event(_EVENTS.get(ending.state, "outbox.ending"), attributes)
    if ending is not None and ending.state in (ActionState.FAILED, ActionState.UNCERTAIN):
        span.set_status(Status(StatusCode.ERROR, ending.stop_reason))
    elif error is not None:
        span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
    span.end()
