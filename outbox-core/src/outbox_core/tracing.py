"""OpenTelemetry traces: one trace from the request that enqueued an action to its provider call.

At enqueue, when a span is active (the application's request, its job), its W3C trace context
(``traceparent``, ``tracestate``) is stored on the action, in ``agent_action.trace_context``:
never in the payload, so the kinds' variants never see it. Each attempt then runs in a span
``outbox.execute <kind>`` (kind CONSUMER) whose parent is that stored context and which also
links to it, as the messaging conventions ask of a consumer; the span is current while the
adapter runs, so an instrumented HTTP or SMTP client's spans nest under it. The write fence, the
outcome and a reread are events on that span. Attributes are the messaging conventions' (see
:data:`SAMPLING_ATTRIBUTES` and :func:`start_attempt`), never a payload value, nor an
exception's message.

With no tracer provider configured (the OpenTelemetry API's default), none of this runs: enqueue
looks at the current span (a context variable read) and stores nothing when none is valid, and
the executor checks once per attempt whether a provider is set (see :func:`enabled`) and
otherwise makes no span (the claim does not return the stored context either). With one, the
claim returns each action's stored context with its row, and a span that the sampler drops
(``ParentBased`` under an unsampled request) costs the parse of the stored ``traceparent`` and
the sampler's decision: no attribute, link or event is built for it. ``docs/tracing.md`` shows
the set-up and ``docs/benchmarks.md`` the cost.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextvars import Token
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    NoOpTracerProvider,
    ProxyTracerProvider,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .states import ActionState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .claimed import ClaimedAction
    from .executor.outcomes import Ending

TRACER_NAME = "outbox"
MESSAGING_SYSTEM = "outbox"
SAMPLING_ATTRIBUTES = {
    "messaging.system": MESSAGING_SYSTEM,
    "messaging.operation.type": "process",
    "messaging.operation.name": "execute",
}
"""The OpenTelemetry messaging conventions' attributes of every attempt span that are the same
for every kind, given at the span's start (with ``messaging.destination.name``, the kind) so
that a sampler can read them. The span's only other attributes are ``messaging.message.id``
(the action's id, on a recorded span) and ``error.type`` (the exception's type, when
execute() raised): the conventions' attributes for a consumer's process span that the outbox
has. Anything else an attempt says (its result, the ending, a reread) is an event."""

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
_tracer: tuple[object, trace.Tracer, bool, bool] | None = None
# A W3C traceparent of version 00 without tracestate: trace id, parent id, flags.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


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
    was current where the executor's tasks were started).

    When the sampler's decision is known without asking it (the SDK's ``ParentBased`` with
    its defaults, and a stored parent that parses), a dropped span builds nothing (see below)
    and a recorded one gets all it has at its start, in one call: the kind's constant attributes
    (built once per kind: :func:`_kind_span`) with the action's id, and the link to the parent.
    Each attribute or link added after the start took the SDK's lock and checks once more,
    about a sixth of a recorded span's cost. Under any other sampler the sampler decides first,
    from the parent and the kind's constant attributes; the id and the link are added only when
    the span records, so that a dropped span builds nothing."""
    tracer, drops_unsampled, keeps_sampled = _get_tracer()
    parent_span = _stored_parent(stored) if stored else None
    name, attributes = _kind_span(claimed.kind)
    if parent_span is not None:
        if drops_unsampled and not parent_span.trace_flags.sampled:
            # What the sampler would leave, without asking it: a non-recording span in the
            # parent's trace (spans made under it, a provider client's, are dropped too and
            # propagate the parent's context).
            return NonRecordingSpan(parent_span)
        parent = trace.set_span_in_context(NonRecordingSpan(parent_span))
        if keeps_sampled and parent_span.trace_flags.sampled:
            return tracer.start_span(
                name,
                context=parent,
                kind=SpanKind.CONSUMER,
                attributes={**attributes, "messaging.message.id": str(claimed.id)},
                links=(Link(parent_span),),
            )
    else:  # none stored, or one that _stored_parent does not read: the propagator's parse
        parent = _propagator.extract(stored) if stored else context.Context()
        parent_span = trace.get_current_span(parent).get_span_context()
    span = tracer.start_span(name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
    if span.is_recording():
        span.set_attribute("messaging.message.id", str(claimed.id))
        if parent_span.is_valid:
            span.add_link(parent_span)
    return span


_kind_spans: dict[str, tuple[str, Mapping[str, str]]] = {}


def _kind_span(kind: str) -> tuple[str, Mapping[str, str]]:
    """The span name and the sampling attributes of a kind's attempts (made once per kind):
    the messaging conventions' attributes that a sampler may read, given at the span's start
    as the conventions ask."""
    try:
        return _kind_spans[kind]
    except KeyError:
        made = (
            f"outbox.execute {kind}",
            MappingProxyType({**SAMPLING_ATTRIBUTES, "messaging.destination.name": kind}),
        )
        _kind_spans[kind] = made
        return made


def _get_tracer() -> tuple[trace.Tracer, bool, bool]:
    """The outbox's tracer of the configured provider, made once per provider, and whether
    that provider's sampler drops every span whose remote parent was not sampled, and keeps
    every span whose remote parent was (see :func:`_parent_based`)."""
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        drops, keeps = _parent_based(provider)
        _tracer = (provider, provider.get_tracer(TRACER_NAME), drops, keeps)
    return _tracer[1], _tracer[2], _tracer[3]


def _parent_based(provider: object) -> tuple[bool, bool]:
    """Whether the provider is the SDK's with a ``ParentBased`` sampler that drops a span under
    a remote parent that was not sampled, and one that keeps a span under a sampled one (the
    SDK's default sampler does both): its decision for such a parent is known without asking
    it (see :func:`start_attempt`)."""
    try:
        from opentelemetry.sdk.trace.sampling import ParentBased
    except ImportError:  # the SDK is the application's choice
        return False, False
    sampler = getattr(provider, "sampler", None)
    if not isinstance(sampler, ParentBased):
        return False, False
    description = sampler.get_description()  # type: ignore[no-untyped-call]
    return (
        "remoteParentNotSampled:AlwaysOffSampler" in description,
        "remoteParentSampled:AlwaysOnSampler" in description,
    )


def _stored_parent(stored: Mapping[str, Any]) -> SpanContext | None:
    """The parent's context from a stored plain W3C ``traceparent`` (version 00, no
    ``tracestate``: what enqueue stores under the SDK's defaults) with one regex match; None
    for anything else, which the propagator parses (and refuses, if it must)."""
    header = stored.get("traceparent")
    if not isinstance(header, str) or "tracestate" in stored:
        return None
    match = _TRACEPARENT.fullmatch(header)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match[3], 16)))


def activate(span: Span) -> Activation:
    """Make ``span`` the current span (of this task) until :func:`deactivate`."""
    return context.attach(trace.set_span_in_context(span))


def deactivate(activation: Activation) -> None:
    context.detach(activation)


def fence_event(span: Span, answer: str) -> None:
    """A write fence's answer (``passed``, ``moved``, ``short``) as an event."""
    if span.is_recording():
        span.add_event("outbox.fence", {"outbox.fence.answer": answer})


def end_attempt(
    span: Span, result: str, ending: Ending | None, error: BaseException | None = None
) -> None:
    """Record what the attempt decided and end its span. ``result`` is the counted result's
    name (``Done``, ``Retry (raised)``, ``Abandoned``, ...); ``ending`` the write it leads to
    (None: abandoned or interrupted, nothing written); ``error`` what execute() raised, by its
    type only. One event says the outcome: the ending's (by the state it leaves), or
    ``outbox.abandoned`` when nothing is written. A span that does not record is only ended."""
    if span.is_recording():
        if error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
        attributes: dict[str, str | float] = {"outbox.result": result}
        if ending is None:
            span.add_event("outbox.abandoned", attributes)
        else:
            attributes["outbox.action.state"] = str(ending.state)
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
