-- The statements of outbox-feedback. {schema} is the outbox schema; parameters are named.

-- name: insert_feedback
-- A feedback once: a second store of the same id (two requests racing) waits on the first's
-- insert and then inserts nothing.
INSERT INTO {schema}.feedback (feedback_id, workspace_id, author_account_id, repository,
                               pull_number, summary)
VALUES (%(feedback)s, %(workspace)s, %(author)s, %(repository)s, %(pull)s, %(summary)s)
ON CONFLICT (feedback_id) DO NOTHING
RETURNING feedback_id

-- name: lock_feedback
-- The feedback under its row lock: every decision, mark and send of one feedback takes it
-- first, so the lane's order is the order the application decided in.
SELECT workspace_id, author_account_id, revision, retracted_at, sends, delivered_revision
  FROM {schema}.feedback
 WHERE feedback_id = %(feedback)s
   FOR UPDATE

-- name: decide_summary
UPDATE {schema}.feedback
   SET summary = %(summary)s, revision = revision + 1, updated_at = now()
 WHERE feedback_id = %(feedback)s

-- name: clear_items
DELETE FROM {schema}.feedback_item WHERE feedback_id = %(feedback)s

-- name: insert_item
INSERT INTO {schema}.feedback_item (feedback_id, item_id, ordinal, path, commit_id, line, side,
                                    body, resolved)
VALUES (%(feedback)s, %(item)s, %(ordinal)s, %(path)s, %(commit_id)s, %(line)s, %(side)s,
        %(body)s, %(resolved)s)

-- name: mark_item
UPDATE {schema}.feedback_item SET resolved = %(resolved)s
 WHERE feedback_id = %(feedback)s AND item_id = %(item)s
RETURNING item_id

-- name: bump_revision
UPDATE {schema}.feedback SET revision = revision + 1, updated_at = now()
 WHERE feedback_id = %(feedback)s

-- name: retract
UPDATE {schema}.feedback
   SET retracted_at = coalesce(retracted_at, now()), revision = revision + 1, updated_at = now()
 WHERE feedback_id = %(feedback)s

-- name: next_send
UPDATE {schema}.feedback SET sends = sends + 1 WHERE feedback_id = %(feedback)s
RETURNING sends

-- name: feedback_view
SELECT f.feedback_id, f.workspace_id, f.repository, f.pull_number, f.summary, f.revision,
       f.retracted_at IS NOT NULL, f.sends, f.delivered_revision, f.last_send_key,
       f.last_send_state, f.last_stop_reason
  FROM {schema}.feedback f
 WHERE f.feedback_id = %(feedback)s

-- name: read_for_send
-- What an attempt writes, under the feedback's lock (a decision waits for the attempt to say
-- which revision it carries, then commits after it and is owed a correction), and the
-- database's clock for the listing lag.
SELECT repository, pull_number, summary, revision, retracted_at IS NOT NULL, now()
  FROM {schema}.feedback
 WHERE feedback_id = %(feedback)s
   FOR UPDATE

-- name: start_send
UPDATE {schema}.feedback
   SET sending_action = %(action)s, sending_revision = revision
 WHERE feedback_id = %(feedback)s

-- name: sent_content
-- What a send of the feedback will show, for its kind's enqueue check (no lock: it only reads).
SELECT summary, retracted_at IS NOT NULL FROM {schema}.feedback WHERE feedback_id = %(feedback)s

-- name: items_of
SELECT item_id, path, commit_id, line, side, body, resolved
  FROM {schema}.feedback_item
 WHERE feedback_id = %(feedback)s
 ORDER BY ordinal, item_id

-- name: ensure_copy
INSERT INTO {schema}.feedback_copy (feedback_id, item_id, surface, marker)
VALUES (%(feedback)s, %(item)s, %(surface)s, %(marker)s)
ON CONFLICT (feedback_id, item_id) DO NOTHING

-- name: copies_of
SELECT item_id, surface, marker, state, provider_id, url, confirmed_digest, confirmed_position,
       write_op, write_digest, write_action, write_started_at
  FROM {schema}.feedback_copy
 WHERE feedback_id = %(feedback)s
 ORDER BY item_id = 'summary' DESC, item_id

-- name: copy_writing
-- Committed before the provider call: this copy's write may reach the tracker from now on.
UPDATE {schema}.feedback_copy
   SET state = 'writing', write_op = %(op)s, write_digest = %(digest)s,
       write_action = %(action)s, write_started_at = now()
 WHERE feedback_id = %(feedback)s AND item_id = %(item)s

-- name: copy_present
UPDATE {schema}.feedback_copy
   SET state = 'present', provider_id = %(provider_id)s, url = %(url)s,
       confirmed_digest = %(digest)s, confirmed_position = %(position)s, confirmed_at = now(),
       write_op = NULL, write_digest = NULL, write_action = NULL, write_started_at = NULL
 WHERE feedback_id = %(feedback)s AND item_id = %(item)s

-- name: copy_absent
UPDATE {schema}.feedback_copy
   SET state = 'absent', provider_id = NULL, url = NULL, confirmed_digest = NULL,
       confirmed_position = NULL, confirmed_at = now(),
       write_op = NULL, write_digest = NULL, write_action = NULL, write_started_at = NULL
 WHERE feedback_id = %(feedback)s AND item_id = %(item)s

-- name: copy_unwritten
-- The tracker proved that the write never reached it (the connection was refused, a rate
-- limit, a refusal): the copy is what it was before.
UPDATE {schema}.feedback_copy
   SET state = CASE WHEN provider_id IS NULL THEN 'absent' ELSE 'present' END,
       write_op = NULL, write_digest = NULL, write_action = NULL, write_started_at = NULL
 WHERE feedback_id = %(feedback)s AND item_id = %(item)s

-- name: lock_feedback_ending
-- The ended hook's lock, taken under a short lock_timeout (set around it): the hook runs in
-- the executor's ending batch, beside other kinds' endings, which must not wait on an
-- application transaction that holds this row.
SELECT revision, retracted_at IS NOT NULL, sending_action, sending_revision, workspace_id,
       author_account_id, sends
  FROM {schema}.feedback
 WHERE feedback_id = %(feedback)s
   FOR UPDATE

-- name: project_copies
-- A send that ended without settling its copies: a copy whose write it may have made stays a
-- copy that may exist ('unknown'); the next send reads it back by its marker first.
UPDATE {schema}.feedback_copy
   SET state = 'unknown'
 WHERE feedback_id = %(feedback)s AND state = 'writing' AND write_action = %(action)s

-- name: send_ended
UPDATE {schema}.feedback
   SET last_send_key = %(key)s, last_send_state = %(state)s, last_stop_reason = %(reason)s,
       delivered_revision = CASE WHEN %(done)s AND sending_action = %(action)s
                                 THEN sending_revision ELSE delivered_revision END,
       sending_action = CASE WHEN sending_action = %(action)s THEN NULL ELSE sending_action END
 WHERE feedback_id = %(feedback)s

-- name: copies_view
SELECT item_id, surface, state, provider_id, url, confirmed_digest, write_op
  FROM {schema}.feedback_copy
 WHERE feedback_id = %(feedback)s
 ORDER BY item_id = 'summary' DESC, item_id

-- name: feedback_of_subject
SELECT feedback_id FROM {schema}.feedback WHERE author_account_id = %(subject)s
 ORDER BY feedback_id
   FOR UPDATE

-- name: erase_feedback
-- Items and copies go with it (ON DELETE CASCADE).
DELETE FROM {schema}.feedback WHERE feedback_id = %(feedback)s
