-- The DRAFT_REPORT kind: not at most once (it writes nothing outside the database, so a
-- repeated call costs only tokens), not instance-level (a report belongs to a workspace).
-- Additive only: an older replica that runs `outbox migrate` never removes it.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('DRAFT_REPORT', false, false, 'draft')
ON CONFLICT (kind) DO NOTHING;

-- The optional limit on model calls in flight across every replica
-- (OUTBOX_DRAFT_MAX_IN_FLIGHT_TOTAL): one row per slot, numbered from 1. A call holds a slot
-- until it releases it or until held_until passes (a replica that died mid-call frees its
-- slot then, on the database's clock).
CREATE TABLE {schema}.draft_slot (
    slot        integer PRIMARY KEY CHECK (slot >= 1),
    action_id   bigint,
    epoch       bigint,
    held_until  timestamptz
);
