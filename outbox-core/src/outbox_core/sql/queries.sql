-- The core's statements. `{schema}` is the configured schema; parameters are named.

-- name: enqueue
-- One round trip per action: the insert (a second insert of the same key does nothing, and
-- waits for a concurrent insert of that key to commit or roll back), the lane's row (kept at
-- or below the new action's due time, and locked until the caller commits, so a claim never
-- decides about the lane without seeing this action), and the wake-up (NOTIFY is delivered
-- only when the caller commits). The request is one JSON array, its columns in the order of
-- REQUEST_COLUMNS (enqueue_rows.py): one parameter for the client to adapt, not one per
-- column, and no key names for it to encode.
-- The wake-up only when an executor waits for one (wake_wanted_v1, migration 0016):
-- PostgreSQL serialises the commits of transactions that notified, so a notification nobody
-- needs costs concurrent producers their group commit.
-- A proposal holds its lane too, so it gets the lane's row, but no due time there (NULL:
-- nothing to claim until it is admitted) and no wake-up.
WITH new_action AS (
    INSERT INTO {schema}.agent_action (
        kind, at_most_once, instance_level, workspace_id, lane_key, idempotency_key, payload,
        subject_account_id, state, max_attempts, due_at, expires_at, trace_context)
    SELECT r->>0, (r->>1)::boolean, (r->>2)::boolean, r->>3, r->>4, r->>5, r->6, r->>7, r->>8,
           (r->>9)::integer, coalesce((r->>10)::timestamptz, now()), (r->>11)::timestamptz,
           NULLIF(r->12, 'null'::jsonb)
      FROM (SELECT %(request)s::jsonb AS r) request
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, kind, lane_key, due_at, state
), lane AS (
    INSERT INTO {schema}.action_lane AS l (lane_key, next_at, head_id, head_kind)
    SELECT lane_key, CASE WHEN state = 'ADMITTED' THEN due_at END, id, kind FROM new_action
    ON CONFLICT (lane_key) DO UPDATE
       SET next_at = LEAST(l.next_at, excluded.next_at),
           head_id = LEAST(l.head_id, excluded.head_id),
           head_kind = CASE WHEN excluded.head_id < l.head_id THEN excluded.head_kind
                            ELSE l.head_kind END
     -- Written only when it changes something (a lane behind its head rarely does): the row
     -- is locked all the same, until the caller commits, and a no-op version costs a tuple
     -- and index entries.
     WHERE l.next_at IS DISTINCT FROM LEAST(l.next_at, excluded.next_at)
        OR l.head_id IS DISTINCT FROM LEAST(l.head_id, excluded.head_id)
)
SELECT id, (SELECT count(pg_notify({channel}, ''))
              FROM new_action WHERE state = 'ADMITTED' AND {schema}.wake_wanted_v1())
  FROM new_action

-- name: enqueue_many
-- The bulk form: the same three steps for a batch of requests in one statement. The batch is
-- one JSON object of columns (enqueue_rows.py): each a list of one value per request in the
-- caller's order, or one value for every request (`whole` below); `each` zips the lists.
-- Its parsing costs the server less than a parameter per column cost the client. The lane
-- rows are upserted once per lane (an upsert may not touch one row twice in a statement), and
-- one wake-up is sent (see enqueue).
-- Two batches that share keys must not deadlock: an insert whose key another transaction has
-- just inserted waits for that transaction, so two batches that insert shared keys in
-- different orders (one reversed) each wait for the other. Every batch therefore inserts in
-- one canonical order, by key in byte order (COLLATE "C"), and takes its lane rows in lane
-- order after all its inserts: each waits only for keys (then lanes) above every one it holds,
-- so no cycle can form. The client gives each request its rank in that order (`key_order`:
-- Python orders str by code point, which is UTF-8's byte order; a key repeated in the batch
-- ranks in the caller's order, so that its first request wins): an integer sort here, not a
-- text one. The ids are drawn in the caller's order (`position`), so that within a lane the
-- actions still run in the order the caller gave them, and the answer lists them ascending:
-- the ids of the requests whose key was new, in the caller's order.
WITH batch AS MATERIALIZED (
    SELECT %(batch)s::jsonb AS b
), whole AS MATERIALIZED (
    SELECT CASE WHEN jsonb_typeof(b->'kind') <> 'array' THEN b->>'kind' END AS kind,
           CASE WHEN jsonb_typeof(b->'at_most_once') <> 'array' THEN b->>'at_most_once' END AS at_most_once,
           CASE WHEN jsonb_typeof(b->'instance_level') <> 'array' THEN b->>'instance_level' END AS instance_level,
           CASE WHEN jsonb_typeof(b->'workspace_id') <> 'array' THEN b->>'workspace_id' END AS workspace_id,
           CASE WHEN jsonb_typeof(b->'lane_key') <> 'array' THEN b->>'lane_key' END AS lane_key,
           CASE WHEN jsonb_typeof(b->'subject_account_id') <> 'array' THEN b->>'subject_account_id' END AS subject_account_id,
           CASE WHEN jsonb_typeof(b->'state') <> 'array' THEN b->>'state' END AS state,
           CASE WHEN jsonb_typeof(b->'max_attempts') <> 'array' THEN b->>'max_attempts' END AS max_attempts,
           CASE WHEN jsonb_typeof(b->'due_at') <> 'array' THEN b->>'due_at' END AS due_at,
           CASE WHEN jsonb_typeof(b->'expires_at') <> 'array' THEN b->>'expires_at' END AS expires_at
      FROM batch
), input AS (
    -- The columns given per request zipped by ROWS FROM; each argument is a subquery run once,
    -- so the scan is not joined to the document and keeps its order (the ordinality's), which
    -- the ids below are drawn in without a sort.
    SELECT coalesce(each.kind, (SELECT kind FROM whole)) AS kind,
           coalesce(each.at_most_once, (SELECT at_most_once FROM whole))::boolean AS at_most_once,
           coalesce(each.instance_level, (SELECT instance_level FROM whole))::boolean
               AS instance_level,
           coalesce(each.workspace_id, (SELECT workspace_id FROM whole)) AS workspace_id,
           coalesce(each.lane_key, (SELECT lane_key FROM whole)) AS lane_key,
           each.idempotency_key, each.payload,
           coalesce(each.subject_account_id, (SELECT subject_account_id FROM whole))
               AS subject_account_id,
           coalesce(each.state, (SELECT state FROM whole)) AS state,
           coalesce(each.max_attempts, (SELECT max_attempts FROM whole))::integer AS max_attempts,
           coalesce(each.due_at, (SELECT due_at FROM whole))::timestamptz AS due_at,
           coalesce(each.expires_at, (SELECT expires_at FROM whole))::timestamptz AS expires_at,
           each.key_order::integer AS key_order, each.position
      FROM ROWS FROM (
               jsonb_array_elements_text((SELECT b->'kind' FROM batch WHERE jsonb_typeof(b->'kind') = 'array')),
               jsonb_array_elements_text((SELECT b->'at_most_once' FROM batch WHERE jsonb_typeof(b->'at_most_once') = 'array')),
               jsonb_array_elements_text((SELECT b->'instance_level' FROM batch WHERE jsonb_typeof(b->'instance_level') = 'array')),
               jsonb_array_elements_text((SELECT b->'workspace_id' FROM batch WHERE jsonb_typeof(b->'workspace_id') = 'array')),
               jsonb_array_elements_text((SELECT b->'lane_key' FROM batch WHERE jsonb_typeof(b->'lane_key') = 'array')),
               jsonb_array_elements_text((SELECT b->'idempotency_key' FROM batch)),
               jsonb_array_elements((SELECT b->'payload' FROM batch)),
               jsonb_array_elements_text((SELECT b->'subject_account_id' FROM batch WHERE jsonb_typeof(b->'subject_account_id') = 'array')),
               jsonb_array_elements_text((SELECT b->'state' FROM batch WHERE jsonb_typeof(b->'state') = 'array')),
               jsonb_array_elements_text((SELECT b->'max_attempts' FROM batch WHERE jsonb_typeof(b->'max_attempts') = 'array')),
               jsonb_array_elements_text((SELECT b->'due_at' FROM batch WHERE jsonb_typeof(b->'due_at') = 'array')),
               jsonb_array_elements_text((SELECT b->'expires_at' FROM batch WHERE jsonb_typeof(b->'expires_at') = 'array')),
               jsonb_array_elements_text((SELECT b->'key_order' FROM batch))
           ) WITH ORDINALITY AS each(kind, at_most_once, instance_level, workspace_id, lane_key,
                                    idempotency_key, payload, subject_account_id, state,
                                    max_attempts, due_at, expires_at, key_order, position)
), new_action AS (
    INSERT INTO {schema}.agent_action (
        id, kind, at_most_once, instance_level, workspace_id, lane_key, idempotency_key,
        payload, subject_account_id, state, max_attempts, due_at, expires_at, trace_context)
    SELECT id, kind, at_most_once, instance_level, workspace_id, lane_key, idempotency_key,
           payload, subject_account_id, state, max_attempts, coalesce(due_at, now()), expires_at,
           %(trace_context)s::jsonb
      FROM (-- The ids, drawn in the caller's order (no sort: the array's order; OFFSET 0 keeps
            -- the key sort below from drawing them in key order). A key that turns out to
            -- exist wastes its id, as a conflicting insert of the column's default would.
            SELECT nextval((SELECT pg_get_serial_sequence('{schema}.agent_action', 'id')
                                   ::regclass)) AS id, input.*
              FROM input
             ORDER BY position
            OFFSET 0) numbered
     -- By key, as ranked by the client.
     ORDER BY key_order
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, kind, lane_key, due_at, state
), lane AS (
    -- Each lane's first new action (its lowest id) and earliest admitted due time; the head's
    -- kind by a join on its id (an array_agg(kind ORDER BY id) sorted each lane's group).
    INSERT INTO {schema}.action_lane AS l (lane_key, next_at, head_id, head_kind)
    SELECT per_lane.lane_key, per_lane.next_at, per_lane.head_id, head.kind
      FROM (SELECT lane_key, min(due_at) FILTER (WHERE state = 'ADMITTED') AS next_at,
                   min(id) AS head_id
              FROM new_action
             GROUP BY lane_key) per_lane
      JOIN new_action head ON head.id = per_lane.head_id
     ORDER BY per_lane.lane_key
    ON CONFLICT (lane_key) DO UPDATE
       SET next_at = LEAST(l.next_at, excluded.next_at),
           head_id = LEAST(l.head_id, excluded.head_id),
           head_kind = CASE WHEN excluded.head_id < l.head_id THEN excluded.head_kind
                            ELSE l.head_kind END
     -- Written only when it changes something (a lane behind its head rarely does): the row
     -- is locked all the same, until the caller commits, and a no-op version costs a tuple
     -- and index entries.
     WHERE l.next_at IS DISTINCT FROM LEAST(l.next_at, excluded.next_at)
        OR l.head_id IS DISTINCT FROM LEAST(l.head_id, excluded.head_id)
)
SELECT (SELECT array_agg(id ORDER BY id) FROM new_action),
       (SELECT count(pg_notify({channel}, ''))
          FROM (SELECT 1 FROM new_action WHERE state = 'ADMITTED' LIMIT 1) admitted
         WHERE {schema}.wake_wanted_v1())

-- name: trace_contexts
-- The trace contexts stored at enqueue of the actions about to run (only while tracing is on).
SELECT id, trace_context
  FROM {schema}.agent_action
 WHERE id = ANY(%(ids)s::bigint[]) AND trace_context IS NOT NULL

-- name: find_by_keys
SELECT idempotency_key, id, kind, lane_key
  FROM {schema}.agent_action
 WHERE idempotency_key = ANY(%(keys)s::text[])

-- name: database_now
SELECT now()

-- name: waiting_register
-- An executor about to wait for a wake-up says so (migration 0016); its row is keyed by the
-- backend of the connection it LISTENs on.
INSERT INTO {schema}.executor_waiting (listener_pid) VALUES (%(pid)s)
ON CONFLICT (listener_pid) DO UPDATE SET since = now()

-- name: waiting_watch
-- Once a registration committed: a snapshot, and a transaction id drawn after it. Every
-- enqueue whose check missed the registration had its id by then, so it is below the drawn
-- one; the ones still running are the snapshot's list and those at or above its xmax (which
-- a snapshot does not list: see waiting_running).
SELECT pg_current_snapshot()::text, pg_current_xact_id()::text::bigint

-- name: waiting_running
-- How many of the watched transactions (waiting_watch) still run.
SELECT count(*)
  FROM (SELECT x FROM pg_snapshot_xip(%(snapshot)s::pg_snapshot) x
        UNION ALL
        SELECT g::text::xid8
          FROM generate_series(pg_snapshot_xmax(%(snapshot)s::pg_snapshot)::text::bigint,
                               %(drawn)s::bigint - 1) g) watched
 WHERE pg_xact_status(x) = 'in progress'

-- name: waiting_leave
DELETE FROM {schema}.executor_waiting WHERE listener_pid = ANY(%(pids)s::integer[])

-- name: waiting_sweep
-- The rows of executors whose listening connection is gone (a killed executor): each costs
-- notifications nobody reads. pg_stat_activity lists every backend's pid to every role.
DELETE FROM {schema}.executor_waiting w
 WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.listener_pid)

-- name: admit
-- PROPOSED -> ADMITTED: the lane's head (or an action behind it) becomes claimable. Due now,
-- or at its not_before if that is later; the lane's row is lowered to that time (and made,
-- for a proposal an older build enqueued without one).
WITH admitted AS (
    UPDATE {schema}.agent_action
       SET state = 'ADMITTED', due_at = GREATEST(due_at, now())
     WHERE id = %(id)s AND state = 'PROPOSED'
    RETURNING id, kind, lane_key, due_at
), lane AS (
    INSERT INTO {schema}.action_lane AS l (lane_key, next_at, head_id, head_kind)
    SELECT lane_key, due_at, id, kind FROM admitted
    ON CONFLICT (lane_key) DO UPDATE
       SET next_at = LEAST(l.next_at, excluded.next_at),
           head_id = LEAST(l.head_id, excluded.head_id),
           head_kind = CASE WHEN excluded.head_id < l.head_id THEN excluded.head_kind
                            ELSE l.head_kind END
     -- Written only when it changes something (a lane behind its head rarely does): the row
     -- is locked all the same, until the caller commits, and a no-op version costs a tuple
     -- and index entries.
     WHERE l.next_at IS DISTINCT FROM LEAST(l.next_at, excluded.next_at)
        OR l.head_id IS DISTINCT FROM LEAST(l.head_id, excluded.head_id)
)
SELECT id, (SELECT count(pg_notify({channel}, '')) FROM admitted WHERE {schema}.wake_wanted_v1())
  FROM admitted

-- name: cancel_unstarted
-- An operator's or a proposal's refusal: only an action that has not started. An admitted
-- action whose write started (it waits out a deferral after a Reread) has: its effect may
-- exist, and CANCELLED would say it does not.
UPDATE {schema}.agent_action
   SET state = 'CANCELLED', payload = NULL, stop_reason = %(reason)s, ended_at = now(),
       last_result = 'Cancelled', last_detail = NULL
 WHERE id = %(id)s AND state IN ('PROPOSED', 'ADMITTED') AND write_started_at IS NULL
RETURNING id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
          attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
          ended_at, stop_reason, readback_ref, last_result, created_at, last_detail

-- name: lower_lanes
-- After an ending: the lanes need a look no later than the given times (NULL: now). Lowering
-- is always safe; a lane that a claim or an enqueue holds right now is skipped and returned,
-- and the caller tries it again after this transaction committed (a lane whose row is gone
-- needs nothing). A lane whose head ended no longer knows its head's kind: every executor
-- may look at it.
WITH wanted AS (
    SELECT lane_key, min(at) AS at, bool_or(cleared) AS cleared
      FROM unnest(%(lanes)b::text[], %(at)b::timestamptz[], %(cleared)b::boolean[])
           AS w(lane_key, at, cleared)
     GROUP BY lane_key
), locked AS (
    -- Each lane with what it is lowered to: the update finds its row by the key (settle_v3
    -- says why).
    SELECT l.lane_key, w.at, w.cleared
      FROM {schema}.action_lane l JOIN wanted w USING (lane_key)
     ORDER BY l.lane_key
       FOR NO KEY UPDATE OF l SKIP LOCKED
), lowered AS (
    UPDATE {schema}.action_lane l
       SET next_at = LEAST(l.next_at, coalesce(k.at, now())),
           head_kind = CASE WHEN k.cleared THEN NULL ELSE l.head_kind END
      FROM locked k
     WHERE l.lane_key = k.lane_key
    RETURNING l.lane_key
)
SELECT w.lane_key FROM wanted w
 WHERE w.lane_key NOT IN (SELECT lane_key FROM lowered)
   AND EXISTS (SELECT 1 FROM {schema}.action_lane l WHERE l.lane_key = w.lane_key)

-- name: action_by_id
SELECT id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
       attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
       ended_at, stop_reason, readback_ref, last_result, created_at, last_detail
  FROM {schema}.agent_action
 WHERE id = %(id)s

-- name: actions_by_keys
-- A read of named keys does not filter: a skipped row would let the caller enqueue under its
-- generation. Decoding readers raise on what they cannot decode instead.
SELECT id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
       attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
       ended_at, stop_reason, readback_ref, last_result, created_at, last_detail
  FROM {schema}.agent_action
 WHERE idempotency_key = ANY(%(keys)s::text[])
 ORDER BY id

-- name: lane_actions
-- A read of one lane does not filter either (see actions_by_keys). Its live actions are read
-- from the lane row's head_id on (at or below the lowest live id), past the lane's ended ones.
SELECT id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
       attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
       ended_at, stop_reason, readback_ref, last_result, created_at, last_detail
  FROM {schema}.agent_action
 WHERE lane_key = %(lane_key)s
   AND (%(live_only)s IS FALSE
        OR state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
           AND id >= coalesce((SELECT l.head_id FROM {schema}.action_lane l
                                WHERE l.lane_key = %(lane_key)s), 0))
 ORDER BY id

-- name: registered_kinds
SELECT kind, at_most_once, instance_level, line FROM {schema}.action_kind ORDER BY kind

-- name: claim
-- See claim_v1 in migrations/core/0002_claim.sql: the lanes first, then their heads (the
-- second half, claim_locked_v1, last replaced by 0011).
-- The last column, only while tracing is on (the traced parameter), is the trace context stored at
-- enqueue of each claimed action: '{}' when none was stored, NULL when this statement's
-- snapshot, older than the claim's own (claim_v1 runs its statements in snapshots of their
-- own), does not see the action (it was enqueued while the claim ran): the executor then reads
-- it (executor/traces.py). A scalar subquery: one probe of the primary key per claimed row,
-- never planned as a join over the table.
SELECT c.op, c.id, c.kind, c.workspace_id, c.lane_key, c.idempotency_key, c.payload,
       c.subject_account_id, c.state, c.attempt, c.max_attempts, c.epoch, c.expires_at,
       c.lease_until, c.write_started_at, c.created_at,
       CASE WHEN %(traced)s AND c.op IN ('claim', 'reclaim') THEN
            (SELECT coalesce(t.trace_context, '{}') FROM {schema}.agent_action t WHERE t.id = c.id)
       END AS trace_context
  FROM {schema}.claim_v1(%(limit)s, make_interval(secs => %(lease)s),
                         %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[]) c

-- name: claim_action
-- As claim, for one named action (run_now); the trace context is left to the executor's read
-- (one action, at a caller's request).
SELECT op, id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
       state, attempt, max_attempts, epoch, expires_at, lease_until, write_started_at, created_at,
       NULL::jsonb AS trace_context
  FROM {schema}.claim_action_v1(%(id)s, make_interval(secs => %(lease)s),
                                %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])

-- name: begin_write
-- The write fence of many running attempts in one short transaction. An attempt passes only
-- while it still holds the claim (same epoch, still executing; an erased action is gone) and
-- at least the margin of its lease is left, so its provider call ends inside the lease.
-- Rows that another transaction holds (an erasure not yet committed, a domain transaction) are
-- skipped, not waited for: one busy row held up every fence of the batch, and the margin,
-- read from the statement's start, then passed fences whose lease had run down meanwhile.
-- Each is returned with the seconds of lease it has left, and asked for again alone.
-- Returns (id, NULL, false) for each fence that passed; (id, seconds left, false) for each
-- refused for the margin, its epoch still the attempt's (the executor gives it back at once);
-- (id, seconds left, true) for each busy row. An action not returned was refused: its epoch
-- moved on, it ended, or it is gone.
WITH f AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(epochs)b::bigint[]) AS f(id, epoch)
), free AS (
    -- The margin is read per row as it is locked (the row lock keeps lease_until as read).
    -- One probe of the primary key per fence (a lateral subquery): no index names `state`
    -- (migration 21), and as a join the planner took the state's rarity for the join's and
    -- scanned the table once per batch.
    SELECT a.id, a.lease_until,
           a.lease_until >= clock_timestamp() + make_interval(secs => %(margin)s) AS roomy
      FROM f CROSS JOIN LATERAL (
           SELECT a.id, a.lease_until FROM {schema}.agent_action a
            WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'
              FOR NO KEY UPDATE SKIP LOCKED) a
), fenced AS (
    UPDATE {schema}.agent_action a
       SET write_started_at = coalesce(a.write_started_at, now())
     WHERE a.id = ANY(ARRAY(SELECT free.id FROM free WHERE free.roomy))
    RETURNING a.id
)
SELECT id, NULL::float8, false FROM fenced
UNION ALL
-- Locked at the attempt's epoch: only its lease stood in the way.
SELECT id, extract(epoch FROM lease_until - clock_timestamp())::float8, false
  FROM free
 WHERE NOT roomy
UNION ALL
SELECT a.id, extract(epoch FROM a.lease_until - clock_timestamp())::float8, true
  FROM (SELECT * FROM f WHERE f.id NOT IN (SELECT id FROM free)) busy  -- hashed, and first
  CROSS JOIN LATERAL (
       SELECT a.id, a.lease_until FROM {schema}.agent_action a
        WHERE a.id = busy.id AND a.epoch = busy.epoch AND a.state = 'EXECUTING'
       OFFSET 0) a  -- OFFSET 0: a probe per row, not a join the planner orders again

-- name: hold_lease
-- Opens an adapter's domain transaction under its lease: the row lock keeps any other claim
-- out until the transaction ends, and no row means the epoch moved on or the lease is over.
-- Returns the lease's milliseconds left, which bound how long the transaction may live.
SELECT floor(extract(epoch FROM lease_until - clock_timestamp()) * 1000)::bigint
  FROM {schema}.agent_action
 WHERE id = %(id)s AND epoch = %(epoch)s AND state = 'EXECUTING'
   AND lease_until > clock_timestamp()
   FOR SHARE

-- name: settle
-- See settle_v3 in migrations/core/0022_settle_v3.sql (settle_v2 of 0013, reading back only
-- what it is asked for): a batch of endings, the lanes they free lowered or their next heads
-- claimed, in one round trip.
-- The batch arrives as one JSON object of aligned arrays: json.dumps builds it in C, where
-- psycopg dumped eleven arrays element by element in Python (3.7 us an ending against 1.3).
-- When brief (a batch without ended()/rescheduled() hooks, which need the whole row), settle_v3
-- returns each ended action's id and attempt only, and they come back as one row: their ids
-- and attempts, in the last two columns; the executor knows the rest from its own endings.
-- Reading every column back cost the executor about as much as the rest of the ending.
WITH e AS (
    SELECT *
      FROM jsonb_to_record(%(endings)s::jsonb) AS e(
               ids bigint[], epochs bigint[], from_states text[], states text[],
               stop_reasons text[], readback_refs text[], delays float8[], fences text[],
               prior_writes timestamptz[], uncounts integer[], results text[],
               details text[])
), s AS (
    SELECT s.*
      FROM e, {schema}.settle_v3(
               e.ids, e.epochs, e.from_states, e.states, e.stop_reasons, e.readback_refs,
               e.delays, e.fences, e.prior_writes, e.uncounts, e.results, e.details, %(chain)s,
               make_interval(secs => %(lease)s),
               %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[], NOT %(brief)s) s
)
SELECT s.*, NULL::bigint[] AS ended_ids, NULL::integer[] AS ended_attempts,
       -- The chained heads' stored trace contexts while tracing is on, as in claim.
       CASE WHEN %(traced)s AND s.op IN ('claim', 'reclaim') THEN
            (SELECT coalesce(t.trace_context, '{}') FROM {schema}.agent_action t WHERE t.id = s.id)
       END AS trace_context
  FROM s WHERE NOT %(brief)s OR s.op <> 'ended'
UNION ALL
SELECT 'ended', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, array_agg(s.id), array_agg(s.attempt),
       NULL
  FROM s WHERE %(brief)s AND s.op = 'ended'
HAVING count(*) > 0

-- name: written_endings
-- After the reply to a batch of endings was lost (the connection dropped once the server had
-- the statement), which of those endings the lost statement wrote: the action is at the
-- ending's epoch, in its state, with its result and stop reason. (The reaper ends an action at
-- the claim's epoch too, but with a result of its own.) An action that moved on since, to a
-- new claim, is not recognised and stays reported as stale.
SELECT a.id, a.attempt
  FROM unnest(%(ids)s::bigint[], %(epochs)s::bigint[], %(states)s::text[],
              %(results)s::text[], %(stop_reasons)s::text[])
           AS e(id, epoch, state, result, stop_reason)
  JOIN {schema}.agent_action a
    ON a.id = e.id AND a.epoch = e.epoch AND a.state = e.state
   AND a.last_result IS NOT DISTINCT FROM e.result
   AND a.stop_reason IS NOT DISTINCT FROM e.stop_reason

-- name: lost_chained_claims
-- After a lost reply, the next heads that the lost settle claimed on the way, in the shape of
-- a claim's rows (claimed_action_v1), so that the executor runs them rather than leave them
-- EXECUTING, with nobody running them, until their lease ends (and a reclaim counts another
-- attempt). The lost transaction wrote them: their row version's xmin is the xmin of the
-- endings it was recognised by.
SELECT 'claim', a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
       a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch,
       a.expires_at, a.lease_until, a.write_started_at, a.created_at,
       coalesce(a.trace_context, '{}')
  FROM {schema}.action_executing x
  JOIN {schema}.agent_action a ON a.id = x.action_id
 WHERE x.lane_key = ANY(%(lanes)s) AND a.state = 'EXECUTING' AND NOT (a.id = ANY(%(ended)s))
   AND a.xmin IN (SELECT e.xmin FROM {schema}.agent_action e WHERE e.id = ANY(%(ended)s))

-- name: lower_lanes_wait
-- As lower_lanes, but waits for the lanes' locks (erasure and operator cancels: rare, and
-- they must not leave a lane waiting on a head that is gone).
UPDATE {schema}.action_lane l
   SET next_at = LEAST(l.next_at, now()), head_kind = NULL
 WHERE l.lane_key = ANY(%(lanes)s::text[])

-- name: expired_actions
-- Admitted actions past their expiry anywhere in a lane (the claim ends expired heads; this
-- sweep ends the ones behind them too, so their domain rows move on). Only rows this build
-- decodes, and only those whose write never started (as claim_locked_v1 since 0009: one whose
-- write may have reached the provider is claimed and reads back instead). Only the expiries
-- after %(since)s: ix_agent_action_expires_at holds every action with an expiry, the ended
-- ones too until retention deletes them (no index may name `state`: migration 21), so the
-- executor reads the expiries that came due since its last sweep, and every one ('-infinity')
-- when it starts and once an hour (outbox_core/executor/maintenance.py).
SELECT id, kind, lane_key, epoch
  FROM {schema}.agent_action a
 WHERE a.expires_at > %(since)s AND a.expires_at <= now()
   AND a.state = 'ADMITTED' AND a.write_started_at IS NULL
   AND {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                             %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])
 ORDER BY a.expires_at
 LIMIT %(limit)s

-- name: retention_delete
-- Ended actions of one retained kind, older than the retention (ended rows have no payload,
-- so this selects by kind only): the kind's actions in id order after %(after)s, at most
-- %(limit)s of them, through ix_agent_action_kind_id (no index names ended_at: an ending
-- writes it, and migration 21 keeps endings HOT). An action that ended before the cutoff was
-- enqueued, and its id drawn, before the cutoff, so it is below every action created after
-- the cutoff: the walk stops at the first of those, and never reads the kind's recent
-- actions. What it steps over (actions enqueued before the cutoff that are live or ended
-- since) it reads again on its next full pass. Returns how many it deleted, whether the pass
-- is over (it reached the recent actions or the kind's last), the last id it read (the
-- caller's next %(after)s while the pass goes on) and the first recent action's id (NULL: none
-- read), below which the caller's next pass may start (outbox_core/executor/maintenance.py).
WITH walked AS MATERIALIZED (
    SELECT a.id, a.ended_at, a.created_at
      FROM {schema}.agent_action a
     WHERE a.kind = %(kind)s AND a.id > %(after)s
     ORDER BY a.id
     LIMIT %(limit)s
), recent AS (
    SELECT min(w.id) AS id FROM walked w
     WHERE w.created_at >= now() - make_interval(secs => %(keep)s)
), doomed AS (
    -- ended_at again on the locked row: an UNCERTAIN action read back again since the walk
    -- is live.
    SELECT a.id FROM {schema}.agent_action a
     WHERE a.id = ANY(ARRAY(SELECT w.id FROM walked w
                             WHERE w.ended_at < now() - make_interval(secs => %(keep)s)
                               AND (w.id < (SELECT id FROM recent)
                                    OR (SELECT id FROM recent) IS NULL)))
       AND a.ended_at < now() - make_interval(secs => %(keep)s)
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.agent_action a USING doomed d WHERE a.id = d.id RETURNING a.id
)
SELECT (SELECT count(*) FROM gone),
       (SELECT id FROM recent) IS NOT NULL OR (SELECT count(*) FROM walked) < %(limit)s,
       (SELECT max(id) FROM walked),
       (SELECT id FROM recent)

-- name: lock_subject_lanes
-- Erasure takes the lanes of the subject's actions first, in key order, as a claim and a settle
-- take a lane before its actions (see outbox_core/lane_locks.py).
SELECT l.lane_key
  FROM {schema}.action_lane l
 WHERE l.lane_key IN (SELECT a.lane_key FROM {schema}.agent_action a
                       WHERE a.subject_account_id = %(subject)s)
 ORDER BY l.lane_key
   FOR NO KEY UPDATE OF l

-- name: lane_rows
-- Which of these lanes have a row (read without a lock): a proposal that an older build
-- enqueued into a lane of its own has none, and taking the lanes again would not give it one.
SELECT lane_key FROM {schema}.action_lane WHERE lane_key = ANY(%(lanes)s::text[])

-- name: lock_subject_actions
-- Then the subject's actions, without waiting: a running attempt's transaction or an ending
-- that holds one may be about to wait for one of the lanes taken above.
SELECT a.id, a.lane_key, a.state
  FROM {schema}.agent_action a
 WHERE a.subject_account_id = %(subject)s
   FOR UPDATE NOWAIT

-- name: lock_action_lane
-- An operator's cancel takes the action's lane first, then the action without waiting, for the
-- same reasons.
SELECT l.lane_key
  FROM {schema}.action_lane l
 WHERE l.lane_key = (SELECT a.lane_key FROM {schema}.agent_action a WHERE a.id = %(id)s)
   FOR NO KEY UPDATE OF l

-- name: lock_action
SELECT a.id FROM {schema}.agent_action a WHERE a.id = %(id)s FOR NO KEY UPDATE NOWAIT

-- name: erase_actions
-- The actions that lock_subject_actions locked (one enqueued since is not among them, as it
-- would not be had it committed a moment later).
DELETE FROM {schema}.agent_action
 WHERE id = ANY(%(ids)s::bigint[])
RETURNING id, kind, lane_key, state

-- name: rows_written_in_transaction
-- Erasure: the rows this transaction has deleted, updated and inserted so far, per table, as
-- PostgreSQL counts them (pg_stat_xact_user_tables: this backend's own counts, any schema). The
-- erasure reads them before and after its deletes, so what it reports per table is what its
-- statements did, with no list of tables kept beside them. Rows of a savepoint that was rolled
-- back count too, as PostgreSQL counts attempted work.
SELECT schemaname || '.' || relname, n_tup_del, n_tup_upd, n_tup_ins
  FROM pg_stat_xact_user_tables
 WHERE n_tup_del + n_tup_upd + n_tup_ins > 0

-- name: counts_rows_written
-- Whether rows_written_in_transaction counts anything: track_counts off (a superuser's
-- setting) leaves every count at zero.
SELECT current_setting('track_counts')::bool

-- name: drop_idle_lanes
-- Erasure: the lanes it took whose live actions are all gone. Their keys may name the erased
-- account (applications write lanes such as account:<id>), and a lane without a live action
-- needs no row: the next enqueue into it makes one again (its upsert, waiting on this delete,
-- inserts). Ended actions need no lane row; those of other accounts keep their own lane key.
-- A live action is at or after the lane row's head_id: the lane's ended actions before it are
-- not read (no index separates live from ended ones: migration 21).
DELETE FROM {schema}.action_lane l
 WHERE l.lane_key = ANY(%(lanes)s::text[])
   AND NOT EXISTS (SELECT 1 FROM {schema}.agent_action a
                    WHERE a.lane_key = l.lane_key AND a.id >= coalesce(l.head_id, 0)
                      AND a.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING'))

-- name: make_due
-- drain(): every waiting action is due now, and every lease that a Reread set, on a row this
-- build decodes, runs out now. Not every executing lease: an attempt that another executor is
-- running (a newer build's among them) would be reclaimed under it.
WITH due AS (
    UPDATE {schema}.agent_action SET due_at = now()
     WHERE state = 'ADMITTED' AND due_at > now()
), leases AS (
    UPDATE {schema}.agent_action a SET lease_until = now()
      FROM {schema}.action_executing x
     WHERE a.id = x.action_id
       AND a.state = 'EXECUTING' AND a.lease_until > now() AND a.last_result = 'Reread'
       AND {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                                 %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])
)
UPDATE {schema}.action_lane SET next_at = now(), head_kind = NULL
 WHERE next_at IS NOT NULL AND next_at > now()

-- name: live_read_sizes
-- The sizes of the lane table and of the action table: outbox_core/live_reads.py chooses from
-- them how the passes over the live actions read them.
SELECT pg_relation_size('{schema}.action_lane'), pg_relation_size('{schema}.agent_action')

-- name: backlog_due
-- What "due" means, for every reader (the gauges, `outbox status`, the dashboard's oldest due
-- action): by kind, for rows this build decodes, the lane heads that could start now, how long
-- the oldest of them has been due, and which it is (its id). A head is due when it is
-- ADMITTED and due_at has come, or EXECUTING under a lease that ran out (a reclaim, or the
-- reaper, takes it now); an
-- action behind a head, or a head whose due time is still ahead (a backoff, a deferral, a
-- not_before), is waiting (backlog_counts), and a head under a live lease is executing.
-- Only a lane whose next_at has come can have a due head (next_at is a lower bound of when
-- its head falls due or its lease ends), so this reads those lanes through
-- ix_action_lane_next, kind by kind and then the lanes of unknown head, at most %(limit)s of
-- each (NULL: all), earliest look first, and finds each head as the claim does (its executing
-- action in action_executing, else its first live action from head_id on: three index
-- probes). It never reads the actions behind the heads, nor a lane whose head waits: its cost
-- is the due heads', not the backlog's.
WITH looks AS (
    SELECT l.lane_key, l.head_id
      FROM unnest(%(kinds)s::text[]) AS k(kind)
      CROSS JOIN LATERAL (
            SELECT l.lane_key, l.head_id FROM {schema}.action_lane l
             WHERE l.head_kind = k.kind AND l.next_at <= now()
             ORDER BY l.next_at
             LIMIT %(limit)s) l
    UNION ALL
    (SELECT l.lane_key, l.head_id FROM {schema}.action_lane l
      WHERE l.head_kind IS NULL AND l.next_at <= now()
      ORDER BY l.next_at
      LIMIT %(limit)s)
)
SELECT h.kind,
       count(*) AS due,
       count(*) FILTER (WHERE h.state = 'ADMITTED') AS due_admitted,
       coalesce(extract(epoch FROM now() - min(h.due_since)), 0)::float8 AS oldest_due_age,
       -- Which head that is, by the smallest (due time, id), in one pass: min() of an array
       -- compares element by element, where array_agg(... ORDER BY) sorted every due head
       -- (96 against 70 ms with 10,000 due heads read, bench/gauges.py claimable).
       (min(ARRAY[extract(epoch FROM h.due_since)::float8, h.id::float8]))[2]::bigint
           AS oldest_due_id
  FROM looks l
  LEFT JOIN {schema}.action_executing x ON x.lane_key = l.lane_key
  LEFT JOIN LATERAL (
        SELECT f.id FROM {schema}.agent_action f
         -- A CASE, which the planner cannot estimate (claim_locked_v1 says why).
         WHERE f.lane_key = l.lane_key
           AND CASE WHEN f.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN true END
           AND f.id >= coalesce(l.head_id, 0)
         ORDER BY f.id LIMIT 1) f ON true
  -- LIMIT keeps each lookup a lookup (see blocked_lanes).
  JOIN LATERAL (
        SELECT h.id, h.kind, h.state, h.due_at, h.lease_until, h.payload, h.idempotency_key,
               CASE WHEN h.state = 'ADMITTED' THEN h.due_at ELSE h.lease_until END AS due_since
          FROM {schema}.agent_action h
         WHERE h.id = coalesce(x.action_id, f.id) LIMIT 1) h ON true
 WHERE (h.state = 'ADMITTED' AND h.due_at <= now()
        OR h.state = 'EXECUTING' AND h.lease_until <= now())
   AND {schema}.decodable_v1(h.kind, h.payload, h.idempotency_key,
                             %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])
 GROUP BY h.kind

-- name: backlog_executing
-- Executing actions under a live lease, by kind, for rows this build decodes: a pass over
-- action_executing, one row per executing action (at most one a lane, and no more than the
-- executors' concurrency), and a probe of each.
SELECT a.kind, count(*)
  FROM {schema}.action_executing x
  JOIN {schema}.agent_action a ON a.id = x.action_id
 WHERE a.state = 'EXECUTING' AND a.lease_until > now()
   AND {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                             %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])
 GROUP BY a.kind

-- name: backlog_counts
-- The admitted and the proposed actions by kind, for rows this build decodes: a pass over
-- every live action, so the executor counts it with the blocked lanes, once a minute. The
-- waiting actions are the admitted ones less the due heads (backlog_due, read in the same
-- snapshot). Proposals are live and hold their lanes: counted apart, as they wait for an
-- admission, not for an executor. Every live action has its lane's row, at or after its
-- head_id (enqueue keeps head_id at or below the lowest live id; a claim moves it to the head):
-- the actions are read lane by lane from there, so the ended actions of the last days, which
-- no index of live ones separates any more (migration 21), are not read. That costs an index
-- probe a lane and one a live action; where the lanes are many for the table's size, or the
-- live actions many (more than %(budget)s read), %(scan)s reads the table once instead
-- (outbox_core/live_reads.py chooses; the branch not taken is a false one-time filter of the
-- plan, never run). A row per kind this build decodes (kind NULL: the rows it does not), with
-- the rows read, which the caller compares with %(budget)s. Whether a row is ours is worked out
-- once a row, in the inner grouping: decodable_v1 only for the kinds of %(filtered)s (those
-- with a path or a key suffix to test, KindFilter.filtered), the kind's name for the others.
-- As one grouping of the whole test, the planner repeated decodable_v1 in the key and each
-- FILTER: 0.8-0.95 s a million live actions against 0.17-0.25 s (docs/benchmarks.md).
SELECT CASE WHEN a.ours THEN a.kind END,
       coalesce(sum(a.n) FILTER (WHERE a.ours AND a.state = 'ADMITTED'), 0)::bigint AS admitted,
       coalesce(sum(a.n) FILTER (WHERE a.ours AND a.state = 'PROPOSED'), 0)::bigint AS proposed,
       sum(a.n)::bigint AS read
  FROM (SELECT a.kind, a.state,
               CASE WHEN a.kind = ANY (%(filtered)s::text[])
                    THEN {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                                               %(kinds)s::text[], %(paths)s::jsonpath[],
                                               %(suffixes)s::text[])
                    ELSE a.kind = ANY (%(kinds)s::text[]) END AS ours,
               count(*) AS n
          FROM (-- Lane by lane: a lateral subquery with OFFSET 0 (as a join, the planner
                -- hashed the lanes and scanned the whole table).
                (SELECT a.kind, a.state, a.payload, a.idempotency_key
                   FROM {schema}.action_lane l
                   CROSS JOIN LATERAL (
                         SELECT a.kind, a.state, a.payload, a.idempotency_key
                           FROM {schema}.agent_action a
                          WHERE a.lane_key = l.lane_key AND a.id >= coalesce(l.head_id, 0)
                            AND a.state IN ('PROPOSED', 'ADMITTED')
                         OFFSET 0) a
                  WHERE NOT %(scan)s
                  LIMIT %(budget)s)
                UNION ALL
                SELECT a.kind, a.state, a.payload, a.idempotency_key
                  FROM {schema}.agent_action a
                 WHERE %(scan)s AND a.state IN ('PROPOSED', 'ADMITTED')) a
         GROUP BY 1, 2, 3) a
 GROUP BY 1

-- name: uncertain_counts
-- The UNCERTAIN actions by kind: action_failure's rows (migration 20), through its index of
-- UNCERTAIN ones.
SELECT kind, count(*) FROM {schema}.action_failure
 WHERE state = 'UNCERTAIN' AND kind = ANY(%(kinds)s::text[])
 GROUP BY kind

-- name: blocked_lanes
-- Lanes whose head waits (a proposal not yet admitted, a retry backoff, a deferral, a row this
-- build cannot decode) with an action behind it; a proposal's head_due is NULL (it has no due
-- time until it is admitted); "since" is when the first action behind the head was enqueued. The head
-- is found as the claim finds it: the lane's executing action (action_executing), else its
-- first live action from action_lane.head_id on (which may lag behind: a chained claim leaves
-- the lane row alone seven times in eight). Lane by lane, from the lane rows: every live
-- action has one, and the ended actions of the last days, which no index of live ones
-- separates any more (migration 21), are not read. A lane whose head does not wait costs its
-- head's probes only; the look behind the head is made for the waiting heads. Where the lanes
-- are many for the table's size, %(scan)s first finds the lanes with two live actions or
-- more (only those can be blocked) in one pass over the table (outbox_core/live_reads.py).
WITH crowded AS MATERIALIZED (
    SELECT c.lane_key FROM {schema}.agent_action c
     WHERE %(scan)s AND c.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
     GROUP BY c.lane_key
    HAVING count(*) > 1
), lanes AS (
    SELECT l.lane_key, l.head_id FROM {schema}.action_lane l WHERE NOT %(scan)s
    UNION ALL
    -- One lookup each per crowded lane: the planner cannot know how few lanes are crowded
    -- (as a join it guessed 20 times too many and hashed both whole tables).
    SELECT l.lane_key, l.head_id
      FROM crowded c
      JOIN LATERAL (
            SELECT l.lane_key, l.head_id FROM {schema}.action_lane l
             WHERE l.lane_key = c.lane_key LIMIT 1) l ON true
)
SELECT h.kind, l.lane_key, h.id AS head_id, h.state AS head_state,
       CASE WHEN h.state <> 'PROPOSED' THEN h.due_at END AS head_due,
       b.created_at AS since,
       NOT {schema}.decodable_v1(h.kind, h.payload, h.idempotency_key,
                                 %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[])
           AS foreign_head
  FROM lanes l
  -- One index lookup each per lane; LIMIT keeps each lookup a lookup (as plain joins the
  -- planner hashed whole tables).
  LEFT JOIN {schema}.action_executing x ON x.lane_key = l.lane_key
  JOIN LATERAL (
        SELECT f.id FROM {schema}.agent_action f
         -- A CASE, which the planner cannot estimate (claim_locked_v1 says why).
         WHERE f.lane_key = l.lane_key
           AND CASE WHEN f.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN true END
           AND f.id >= coalesce(l.head_id, 0)
         ORDER BY f.id LIMIT 1) f ON true
  JOIN LATERAL (
        SELECT h.id, h.kind, h.state, h.due_at, h.payload, h.idempotency_key
          FROM {schema}.agent_action h
         WHERE h.id = coalesce(x.action_id, f.id) LIMIT 1) h ON true
  JOIN LATERAL (
        SELECT w.created_at FROM {schema}.agent_action w
         -- A CASE, as above: the first live action after the head, not the lane's backlog.
         WHERE w.lane_key = l.lane_key
           AND CASE WHEN w.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN true END
           AND w.id > h.id
         ORDER BY w.id LIMIT 1) b ON true
 WHERE h.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
   AND (h.state = 'PROPOSED'
        OR h.state = 'ADMITTED' AND h.due_at > now()
        OR NOT {schema}.decodable_v1(h.kind, h.payload, h.idempotency_key,
                                     %(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[]))
 ORDER BY b.created_at
 LIMIT %(limit)s

-- name: retrying_actions
-- For `outbox status`: the live actions whose last attempt did not end them (a Retry, a
-- Defer, a Reread, an attempt that raised), with that attempt's detail, the soonest to run
-- again first. A pass over the live actions, lane by lane or over the table as backlog_counts
-- reads them (%(scan)s): status runs once, when an operator asks; the executor never runs it.
SELECT a.id, a.kind, a.lane_key, a.state, a.attempt, a.max_attempts, a.last_result,
       a.last_detail, CASE WHEN a.state = 'ADMITTED' THEN a.due_at ELSE a.lease_until END AS at
  FROM (SELECT a.*
          FROM {schema}.action_lane l
          CROSS JOIN LATERAL (
                SELECT a.* FROM {schema}.agent_action a
                 WHERE a.lane_key = l.lane_key AND a.id >= coalesce(l.head_id, 0)
                   AND a.state IN ('ADMITTED', 'EXECUTING')
                   AND a.last_result IN ('Retry', 'Defer', 'Reread')
                OFFSET 0) a
         WHERE NOT %(scan)s
        UNION ALL
        SELECT a.* FROM {schema}.agent_action a
         WHERE %(scan)s AND a.state IN ('ADMITTED', 'EXECUTING')
           AND a.last_result IN ('Retry', 'Defer', 'Reread')) a
 ORDER BY at, a.id
 LIMIT %(limit)s

-- name: recent_failures
-- For `outbox status`: the actions that ended FAILED or UNCERTAIN in the last day, newest
-- first, with their last attempt's detail (action_failure's index of endings, read from its
-- end).
SELECT a.id, a.kind, a.lane_key, a.state, a.attempt, a.max_attempts, a.last_result,
       a.last_detail, a.ended_at AS at, a.stop_reason
  FROM {schema}.action_failure f
  JOIN {schema}.agent_action a ON a.id = f.action_id
 WHERE f.ended_at > now() - interval '1 day'
 ORDER BY f.ended_at DESC, f.action_id DESC
 LIMIT %(limit)s

-- name: register_kind
-- A kind registered outside a migration line (the quickstart's demo kind, tests' throwaway
-- kinds). Kinds are only ever added.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES (%(kind)s, %(at_most_once)s, %(instance_level)s, %(line)s)
ON CONFLICT (kind) DO NOTHING

-- name: progress
SELECT count(*) FILTER (WHERE state = 'DONE'), count(*) FILTER (WHERE ended_at IS NOT NULL)
  FROM {schema}.agent_action
 WHERE id = ANY(%(ids)s::bigint[])

-- The dashboard's panels (outbox_core/dashboard). Each reads what an operator reviews, never
-- a payload.

-- name: dashboard_state_counts
-- Every action by kind and state (the ended ones too, until retention deletes them): one pass
-- over the table, made when a page or a live refresh asks (at most once a second per viewer).
SELECT kind, state, count(*) FROM {schema}.agent_action GROUP BY kind, state ORDER BY kind, state

-- name: dashboard_uncertain
-- The UNCERTAIN actions to review, newest first (action_failure's UNCERTAIN rows).
SELECT a.id, a.kind, a.lane_key, a.readback_ref, a.stop_reason, a.ended_at
  FROM {schema}.action_failure f
  JOIN {schema}.agent_action a ON a.id = f.action_id
 WHERE f.state = 'UNCERTAIN'
 ORDER BY f.action_id DESC
 LIMIT %(limit)s

-- name: dashboard_failures
-- Failures of the last day by kind and stop reason (action_failure's index of endings).
SELECT a.kind, a.stop_reason, count(*), max(a.ended_at)
  FROM {schema}.action_failure f
  JOIN {schema}.agent_action a ON a.id = f.action_id
 WHERE f.state = 'FAILED' AND f.ended_at > now() - interval '1 day'
 GROUP BY a.kind, a.stop_reason
 ORDER BY count(*) DESC, a.kind, a.stop_reason

-- name: dashboard_throughput
-- Actions ended in each minute of the last hour, by the state they ended in; minutes without
-- any are left out (the page draws them as empty). A pass over the table, as the state counts
-- above: no index names ended_at (an ending writes it, and migration 21 keeps endings HOT).
SELECT date_trunc('minute', ended_at) AS minute, state, count(*)
  FROM {schema}.agent_action
 WHERE ended_at > now() - interval '1 hour'
 GROUP BY 1, 2
 ORDER BY 1, 2

-- name: operator_lock_actions
-- The actions an operator's resolve or retry names, locked in id order (an executor's ending
-- that holds one is waited for, and then its outcome is what the operator's check reads), with
-- what the check needs beyond the action's columns: the kind's flag, the payload kept at its
-- ending (migration 0018), and the retries already made of it.
SELECT a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
       a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch, a.due_at,
       a.expires_at, a.lease_until, a.write_started_at, a.ended_at, a.stop_reason,
       a.readback_ref, a.last_result, a.created_at, a.last_detail,
       a.at_most_once, k.payload,
       (SELECT max(au.related_action_id) FROM {schema}.action_audit au
         WHERE au.action_id = a.id AND au.command = 'retry' AND au.before_state IS NOT NULL)
  FROM {schema}.agent_action a
  LEFT JOIN {schema}.action_kept_payload k ON k.action_id = a.id
 WHERE a.id = ANY(%(ids)s::bigint[])
 ORDER BY a.id
   FOR UPDATE OF a

-- name: audit_write
-- One audit row, before the change it records (guard_agent_action reads it for a resolution).
-- Who: the name the operator gave, else the database role of the session.
INSERT INTO {schema}.action_audit (action_id, actor, command, reason, surface, before_state,
                                   after_state, related_action_id, readback_ref)
VALUES (%(id)s, coalesce(%(by)s, session_user), %(command)s, %(reason)s, %(surface)s,
        %(before)s, %(after)s, %(related)s, %(ref)s)

-- name: audit_of_action
SELECT id, action_id, at, actor, command, reason, surface, before_state, after_state,
       related_action_id, readback_ref
  FROM {schema}.action_audit
 WHERE action_id = %(id)s
 ORDER BY id

-- name: resolve_ended
-- An operator's resolution of an UNCERTAIN action into DONE (with the reference found at the
-- provider) or FAILED; the trigger checks the audit row written just before.
UPDATE {schema}.agent_action
   SET state = %(state)s, stop_reason = %(reason)s, readback_ref = %(ref)s
 WHERE id = %(id)s AND state = 'UNCERTAIN'
RETURNING id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state,
          attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at,
          ended_at, stop_reason, readback_ref, last_result, created_at, last_detail

-- name: resolve_readback
-- An UNCERTAIN action of a read-back kind back to ADMITTED, due now, with its kept payload and
-- its fence's mark, so that its next attempt reads back before it writes, as after a lost
-- lease; one more attempt than it has spent, so that the read-back runs even when the action
-- ended at its last. Its lane's row is made or lowered as an admission's is.
WITH revived AS (
    UPDATE {schema}.agent_action a
       SET state = 'ADMITTED', payload = k.payload, stop_reason = NULL, ended_at = NULL,
           readback_ref = NULL, due_at = now(), max_attempts = GREATEST(a.max_attempts, a.attempt + 1)
      FROM {schema}.action_kept_payload k
     WHERE a.id = %(id)s AND a.state = 'UNCERTAIN' AND k.action_id = a.id
    RETURNING a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
              a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch, a.due_at,
              a.expires_at, a.lease_until, a.write_started_at, a.ended_at, a.stop_reason,
              a.readback_ref, a.last_result, a.created_at, a.last_detail
), lane AS (
    INSERT INTO {schema}.action_lane AS l (lane_key, next_at, head_id, head_kind)
    SELECT lane_key, due_at, id, kind FROM revived
    ON CONFLICT (lane_key) DO UPDATE
       SET next_at = LEAST(l.next_at, excluded.next_at),
           head_id = LEAST(l.head_id, excluded.head_id),
           head_kind = CASE WHEN excluded.head_id < l.head_id THEN excluded.head_kind
                            ELSE l.head_kind END
)
SELECT revived.*, (SELECT count(pg_notify({channel}, '')) FROM revived
                    WHERE {schema}.wake_wanted_v1())
  FROM revived
