-- The statements of outbox-slack. `{schema}` is the outbox's schema; parameters are named.

-- name: insert_turn
-- The first of two concurrent posts of one turn inserts it; the second waits for the first's
-- commit here and then inserts nothing (and returns the first action), so a turn is stored once.
INSERT INTO {schema}.slack_turn
       (turn_id, workspace_id, channel, thread_ts, subject_account_id, idempotency_key)
VALUES (%(turn_id)s, %(workspace_id)s, %(channel)s, %(thread_ts)s, %(subject)s, %(key)s)
ON CONFLICT (turn_id) DO NOTHING
RETURNING turn_id

-- name: posted_turn
-- A turn stored before: its action, if the action still exists.
SELECT t.turn_id, a.id
  FROM {schema}.slack_turn t
  LEFT JOIN {schema}.agent_action a ON a.id = t.action_id
 WHERE t.turn_id = %(turn_id)s

-- name: taken_entries
SELECT entry_id, turn_id FROM {schema}.slack_entry WHERE entry_id = ANY(%(ids)s::text[])

-- name: set_turn_action
UPDATE {schema}.slack_turn SET action_id = %(action_id)s WHERE turn_id = %(turn_id)s

-- name: insert_entries
INSERT INTO {schema}.slack_entry (entry_id, turn_id, entry_kind, position, channel, text)
SELECT e.entry_id, %(turn_id)s, e.entry_kind, e.position, e.channel, e.text
  FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(positions)s::int[], %(channels)s::text[],
              %(texts)s::text[]) AS e(entry_id, entry_kind, position, channel, text)

-- name: post_content
-- What one attempt posts: the turn's channel and thread, its unredacted entries in order, and
-- the database's clock (the read-back's times are the database's).
SELECT t.channel, t.thread_ts, t.readback_cursor, t.readback_started_at, now(),
       coalesce(array_agg(e.entry_id ORDER BY e.position)
                FILTER (WHERE e.text IS NOT NULL), '{}'),
       coalesce(array_agg(e.entry_kind ORDER BY e.position)
                FILTER (WHERE e.text IS NOT NULL), '{}'),
       coalesce(array_agg(e.text ORDER BY e.position) FILTER (WHERE e.text IS NOT NULL), '{}')
  FROM {schema}.slack_turn t
  LEFT JOIN {schema}.slack_entry e ON e.turn_id = t.turn_id
 WHERE t.turn_id = %(turn_id)s
 GROUP BY t.turn_id

-- name: save_readback
-- Under the attempt's lease (attempt.transaction()): a stale attempt cannot write it.
UPDATE {schema}.slack_turn
   SET readback_cursor = %(cursor)s, readback_started_at = %(started_at)s
 WHERE turn_id = %(turn_id)s

-- name: lock_turn_of_action
-- The ending and a redaction of the same turn take the turn's row first, so one of them sees
-- the other's commit: a redaction that commits while the post ends is never missed.
SELECT turn_id FROM {schema}.slack_turn WHERE action_id = %(action_id)s FOR UPDATE

-- name: lock_turn_of_entry
SELECT t.turn_id, t.action_id
  FROM {schema}.slack_turn t
  JOIN {schema}.slack_entry e ON e.turn_id = t.turn_id
 WHERE e.entry_id = %(entry_id)s
   FOR UPDATE OF t

-- name: store_message_ref
UPDATE {schema}.slack_entry SET message_channel = %(channel)s, message_ts = %(ts)s
 WHERE turn_id = %(turn_id)s

-- name: clear_readback
UPDATE {schema}.slack_turn SET readback_cursor = NULL, readback_started_at = NULL
 WHERE turn_id = %(turn_id)s

-- name: redact_entry
UPDATE {schema}.slack_entry SET text = NULL, redacted_at = now()
 WHERE entry_id = %(entry_id)s AND text IS NOT NULL
RETURNING entry_id

-- name: unredacted_left
SELECT count(*) FROM {schema}.slack_entry WHERE turn_id = %(turn_id)s AND text IS NOT NULL

-- name: remove_ended_action
-- Every entry of the turn is redacted and its action ended: record on the entries what they
-- keep of the delivery, then remove the action (its outcome and key are kept no longer).
WITH gone AS (
    DELETE FROM {schema}.agent_action
     WHERE id = %(action_id)s AND kind = 'SLACK_POST'
       AND state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
    RETURNING state, stop_reason, readback_ref
)
UPDATE {schema}.slack_entry e
   SET outcome = g.state, stop_reason = g.stop_reason
  FROM gone g
 WHERE e.turn_id = %(turn_id)s
RETURNING e.entry_id

-- name: erase_subject
DELETE FROM {schema}.slack_turn WHERE subject_account_id = %(subject)s
