-- The statements of outbox-draft. {schema} is the outbox schema; parameters are named.

-- name: add_slots
-- The cross-replica limit's slots 1..limit (a raised limit adds rows; a lowered one leaves
-- the higher slots unused: take_slot reads only slots up to the limit).
INSERT INTO {schema}.draft_slot (slot)
SELECT generate_series(1, %(limit)s)
ON CONFLICT (slot) DO NOTHING

-- name: take_slot
-- A free slot for this attempt: one whose holder released it or whose hold ran out, or the one
-- this action already holds (an attempt after a crash). SKIP LOCKED: two replicas taking at
-- once take different slots, and one that finds every free slot being taken gets none (it
-- defers) rather than waiting.
UPDATE {schema}.draft_slot s
   SET action_id = %(action)s, epoch = %(epoch)s,
       held_until = now() + make_interval(secs => %(hold)s)
 WHERE s.slot = (
        SELECT slot FROM {schema}.draft_slot
         WHERE slot <= %(limit)s
           AND (held_until IS NULL OR held_until <= now() OR action_id = %(action)s)
         ORDER BY action_id = %(action)s DESC, slot
         LIMIT 1
           FOR UPDATE SKIP LOCKED)
RETURNING s.slot

-- name: release_slot
-- The call ended: its slot is free again (only the attempt that holds it frees it).
UPDATE {schema}.draft_slot
   SET action_id = NULL, epoch = NULL, held_until = NULL
 WHERE action_id = %(action)s AND epoch = %(epoch)s

-- name: slots_held
SELECT count(*) FROM {schema}.draft_slot WHERE held_until > now()

-- name: report_text
-- The enqueue check: the text a draft of this generation would send (none yet while
-- submit_report checks before it stores the report, or edit_report before the new generation).
SELECT text FROM {schema}.issue_report
 WHERE report_id = %(report)s AND generation = %(generation)s
