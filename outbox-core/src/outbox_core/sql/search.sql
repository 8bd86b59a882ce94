-- outbox-core: finding actions (`outbox actions`, the dashboard's search; outbox_core/search.py).
--
-- A search is one statement, `find_actions`, whose two `{...}` places take the filter's
-- conditions from the `when_*` pieces below (fixed text, values always named parameters):
--
--   {driving}   the one condition that picks the index the walk follows, newest first, from
--               the cursor: a field with an index in id order (migration 0019), or none, and
--               then the primary key;
--   {filtering} every other condition of the filter, tested on the rows the walk reaches.
--
-- The inner LIMIT is the candidate window: however few rows match the filtering conditions,
-- a page reads at most that many rows of the walk. A page that ran out of its window before it
-- was full says so ("more may match") and its cursor goes on below the window.

-- name: find_actions
SELECT id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
       attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
       ended_at, stop_reason, readback_ref, last_result, created_at, last_detail
  FROM (SELECT *
          FROM {schema}.agent_action a
         WHERE a.id < %(before)s
               {driving}
         ORDER BY a.id DESC
         LIMIT %(window)s) a
 WHERE true
       {filtering}
 ORDER BY a.id DESC
 LIMIT %(limit)s

-- name: window_end
-- Where a page's window ended (its last id) and how many rows it read, for a page that came
-- back short: the same walk as find_actions, without the filtering conditions, over the index
-- alone where the visibility map allows.
SELECT count(*), min(a.id)
  FROM (SELECT a.id
          FROM {schema}.agent_action a
         WHERE a.id < %(before)s
               {driving}
         ORDER BY a.id DESC
         LIMIT %(window)s) a

-- name: key_prefix_size
-- How many actions a key prefix matches, counted no further than the window plus one: a
-- prefix that matches more is a filtering condition of the primary key's walk instead, since
-- the prefix index is in key order, not id order.
SELECT count(*)
  FROM (SELECT 1
          FROM {schema}.agent_action a
         WHERE true
               {driving}
         LIMIT %(window)s + 1) a

-- name: when_key
AND a.idempotency_key = %(key)s

-- name: when_lane_key
AND a.lane_key = %(lane_key)s

-- name: when_subject
AND a.subject_account_id = %(subject)s

-- name: when_key_prefix
-- The range is what the index ix_agent_action_key_c serves; starts_with() is the exact test.
AND a.idempotency_key COLLATE "C" >= %(key_prefix)s
AND a.idempotency_key COLLATE "C" < %(key_prefix_end)s
AND starts_with(a.idempotency_key, %(key_prefix)s)

-- name: when_workspace
AND a.workspace_id = %(workspace)s

-- name: when_kind
AND a.kind = %(kind)s

-- name: when_states
AND a.state = ANY(%(states)s::text[])

-- name: when_stop_reason
AND a.stop_reason = %(stop_reason)s

-- name: when_created_since
AND a.created_at >= %(created_since)s

-- name: when_created_until
AND a.created_at < %(created_until)s

-- name: when_ended_since
AND a.ended_at >= %(ended_since)s

-- name: when_ended_until
AND a.ended_at < %(ended_until)s
