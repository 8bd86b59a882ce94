-- The core line, version 14: the trace context of the span that was active at enqueue.
--
-- The W3C trace context (`{"traceparent": "00-...", "tracestate": "..."}`) of the application's
-- span at enqueue, so that every attempt's span is a child of it and links to it: one trace
-- from the request that enqueued to the provider call (outbox_core/tracing.py). NULL when no
-- span was active (and for every row of a build before this one). Beside the payload, never
-- inside it: the kinds' variants and their JSON paths never see it.
--
-- Adding a nullable column without a default changes only the catalog (no rewrite of the
-- table, a brief ACCESS EXCLUSIVE lock); an older build's inserts leave it NULL.
ALTER TABLE {schema}.agent_action ADD COLUMN trace_context jsonb;

COMMENT ON COLUMN {schema}.agent_action.trace_context IS
    'W3C trace context (traceparent, tracestate) of the span active at enqueue; NULL without one';
