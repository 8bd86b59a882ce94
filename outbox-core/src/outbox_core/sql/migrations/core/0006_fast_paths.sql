-- The core line, version 6: the three statements that every action passes through, made
-- cheaper, with the same contracts (a replica of an older build calls the same functions).
--   * The guard trigger skips its PL/pgSQL function for a well-formed claim, a complete ending,
--     a fence, a reread and a retry, decided by a WHEN clause that PostgreSQL evaluates without
--     calling a function. Every other update still runs the whole function, which stays the
--     one statement of the lifecycle (0001). The function cost about 5 us per update, and every
--     action is updated at least twice.
--   * settle_v1 sets ended_at itself (the function did), so that its endings take that path.
--   * claim_locked_v1 leaves a lane row alone when it already says what it must.
-- The two functions are restated in full, because applied migrations never change; only the
-- lines marked "(changed)" differ from 0005 and 0002.

DROP TRIGGER guard_agent_action ON {schema}.agent_action;

-- The WHEN clause holds only for updates that the function would let through unchanged: the
-- identity columns kept, and one of
--   * a claim of an admitted action (epoch and attempt up by one; an at-most-once action only
--     before its write started);
--   * an ending of an executing action at its epoch, with a stop reason, no payload and
--     ended_at set;
--   * an update at the same epoch that keeps a live action's state (a fence, a reread, an
--     enqueue's lowering of due_at) or returns an executing action to ADMITTED (a retry, a
--     deferral).
-- Every column it reads is NOT NULL, or tested with IS; coalesce keeps a NULL from ever
-- skipping the function.
CREATE TRIGGER guard_agent_action
    BEFORE UPDATE ON {schema}.agent_action
    FOR EACH ROW
    WHEN (NOT coalesce(
        NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.lane_key = OLD.lane_key
        AND NEW.idempotency_key = OLD.idempotency_key
        AND ((OLD.state = 'ADMITTED' AND NEW.state = 'EXECUTING'
              AND NEW.epoch = OLD.epoch + 1 AND NEW.attempt = OLD.attempt + 1
              AND NOT (OLD.at_most_once AND OLD.write_started_at IS NOT NULL))
          OR (OLD.state = 'EXECUTING' AND NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
              AND NEW.epoch = OLD.epoch AND NEW.stop_reason IS NOT NULL
              AND NEW.payload IS NULL AND NEW.ended_at IS NOT NULL)
          OR (NEW.epoch = OLD.epoch
              AND ((NEW.state = OLD.state AND OLD.state IN ('ADMITTED', 'EXECUTING'))
                   OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED')))),
        false))
    EXECUTE FUNCTION {schema}.guard_agent_action();

-- claim_locked_v1 as in 0002, but for the marked lines.
CREATE OR REPLACE FUNCTION {schema}.claim_locked_v1(
    p_lanes text[], p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[],
    p_run_now bigint DEFAULT NULL
) RETURNS SETOF {schema}.claimed_action_v1
LANGUAGE plpgsql
-- Plan once, not on every call: planning these statements cost more than running them for
-- the one-lane batches a busy lane sends, and the generic plan is as good for large ones.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lanes AS (
        SELECT l.lane_key, coalesce(l.head_id, 0) AS head_id
          FROM {schema}.action_lane l
         WHERE l.lane_key = ANY(p_lanes)
    ), cur AS (
        SELECT l.lane_key, coalesce(x.id, h.id) AS id, h.id AS first_id
          FROM lanes l
          LEFT JOIN LATERAL (
                SELECT e.id FROM {schema}.agent_action e
                 WHERE e.lane_key = l.lane_key AND e.state = 'EXECUTING') x ON true
          LEFT JOIN LATERAL (
                SELECT f.id FROM {schema}.agent_action f
                 WHERE f.lane_key = l.lane_key AND f.state IN ('ADMITTED', 'EXECUTING')
                   -- head_id is at or below the lane's lowest live id (enqueue lowers it, a
                   -- claim sets it to the first live action): starting there skips the index
                   -- entries of the lane's ended actions, which a busy lane piles up.
                   AND f.id >= l.head_id
                 ORDER BY f.id LIMIT 1) h ON true
    ), plan AS (
        SELECT c.lane_key, c.first_id, a.id, a.kind, a.state, a.epoch, a.lease_until, a.due_at, a.expires_at,
               CASE
                 WHEN a.id IS NULL THEN 'empty'
                 WHEN a.id IS DISTINCT FROM coalesce(p_run_now, a.id) THEN 'other'
                 WHEN NOT {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                                                p_kinds, p_paths, p_suffixes) THEN 'foreign'
                 WHEN a.state = 'EXECUTING' AND a.lease_until > now() THEN 'busy'
                 WHEN a.state = 'EXECUTING' AND a.at_most_once
                      AND a.write_started_at IS NOT NULL THEN 'reap_lost'
                 WHEN a.state = 'EXECUTING' AND a.attempt >= a.max_attempts THEN 'reap_exhausted'
                 WHEN a.state = 'EXECUTING' THEN 'reclaim'
                 WHEN a.expires_at <= now() THEN 'expire'
                 WHEN a.due_at <= now() OR a.id = p_run_now THEN 'claim'
                 ELSE 'wait'
               END AS op
          FROM cur c
          LEFT JOIN {schema}.agent_action a ON a.id = c.id
    ), claimed AS (
        -- The state, epoch and lease conditions make a row that an ending changed since this
        -- statement's snapshot drop out instead of failing the trigger; its ender lowers the
        -- lane's next_at again once it has committed.
        UPDATE {schema}.agent_action a
           SET state = 'EXECUTING', epoch = a.epoch + 1, attempt = a.attempt + 1,
               lease_until = now() + p_lease
          FROM plan p
         WHERE a.id = p.id AND p.op IN ('claim', 'reclaim')
           AND a.state = p.state AND a.epoch = p.epoch
           AND a.lease_until IS NOT DISTINCT FROM p.lease_until
        RETURNING p.op, a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
                  a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch,
                  a.expires_at, a.lease_until, a.write_started_at, a.created_at
    ), dropped AS (
        DELETE FROM {schema}.action_lane l USING plan p
         WHERE l.lane_key = p.lane_key AND p.op = 'empty'
    ), moved AS (
        UPDATE {schema}.action_lane l
           SET head_id = p.first_id,
               head_kind = p.kind,
               next_at = CASE p.op
                   WHEN 'foreign' THEN l.next_at
                   WHEN 'other' THEN l.next_at
                   WHEN 'busy' THEN p.lease_until
                   WHEN 'claim' THEN now() + p_lease
                   WHEN 'reclaim' THEN now() + p_lease
                   WHEN 'wait' THEN LEAST(p.due_at, p.expires_at)
                   -- reap and expire: the caller ends the action now, and its ending lowers
                   -- next_at; this is the look again if that ending never comes.
                   ELSE now() + interval '30 seconds'
               END
          FROM plan p
         WHERE l.lane_key = p.lane_key AND p.op <> 'empty'
           -- (changed) A claim leaves a lane row alone that already says what it must: the
           -- head's kind, and a next look in the future but not after this lease ends (a lower
           -- bound stays right). Each chained claim moved the row before, a fifth of a claim's
           -- cost. head_id then lags behind the head: the next head search steps over the
           -- index entries of the actions that ended in between, so one claim in eight moves
           -- the row anyway, and the lag stays a few entries long.
           AND NOT (p.op IN ('claim', 'reclaim')
                    AND l.head_kind = p.kind
                    AND l.next_at > now() AND l.next_at <= now() + p_lease
                    AND random() >= 0.125)
    )
    SELECT * FROM claimed
    UNION ALL
    SELECT p.op, a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
           a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch,
           a.expires_at, a.lease_until, a.write_started_at, a.created_at
      FROM plan p JOIN {schema}.agent_action a ON a.id = p.id
     WHERE p.op IN ('reap_lost', 'reap_exhausted', 'expire');
END
$fn$;

-- settle_v1 as in 0005, but for the marked lines.
CREATE OR REPLACE FUNCTION {schema}.settle_v1(
    p_ids bigint[], p_epochs bigint[], p_from_states text[], p_states text[],
    p_stop_reasons text[], p_readback_refs text[], p_delays float8[], p_fences text[],
    p_prior_writes timestamptz[], p_uncounts integer[], p_results text[],
    p_chain boolean, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.settled_v1
LANGUAGE plpgsql
-- Plan once, not on every call: planning these statements cost more than running them for
-- the one-lane batches a busy lane sends, and the generic plan is as good for large ones.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_ended {schema}.agent_action[];
    v_chain text[];
    v_locked text[] := '{}';
BEGIN
    WITH changed AS (
        UPDATE {schema}.agent_action a
           SET state = e.state,
               payload = CASE WHEN e.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                              THEN NULL ELSE a.payload END,
               stop_reason = e.stop_reason,
               readback_ref = coalesce(e.readback_ref, a.readback_ref),
               due_at = CASE WHEN e.state = 'ADMITTED'
                             THEN now() + make_interval(secs => e.delay) ELSE a.due_at END,
               lease_until = CASE WHEN e.state = 'EXECUTING'
                                  THEN now() + make_interval(secs => e.delay)
                                  WHEN e.state = 'ADMITTED' THEN NULL
                                  ELSE a.lease_until END,
               write_started_at = CASE e.fence WHEN 'clear' THEN NULL
                                               WHEN 'restore' THEN e.prior_write
                                               ELSE a.write_started_at END,
               attempt = a.attempt - e.uncount,
               last_result = e.result,
               -- (changed) Set here, not by the guard's function, so that an ending takes the
               -- guard's fast path.
               ended_at = CASE WHEN e.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                               THEN now() ELSE a.ended_at END
          FROM unnest(p_ids, p_epochs, p_from_states, p_states, p_stop_reasons,
                      p_readback_refs, p_delays, p_fences, p_prior_writes, p_uncounts,
                      p_results)
               AS e(id, epoch, from_state, state, stop_reason, readback_ref, delay, fence,
                    prior_write, uncount, result)
         WHERE a.id = e.id AND a.epoch = e.epoch AND a.state = e.from_state
        RETURNING a
    )
    SELECT array_agg(changed.a ORDER BY (changed.a).id) INTO v_ended FROM changed;
    IF v_ended IS NULL THEN
        RETURN;
    END IF;

    -- Lanes whose every changed action ended: their heads are gone.
    SELECT array_agg(lane_key ORDER BY lane_key) INTO v_chain
      FROM (SELECT x.lane_key FROM unnest(v_ended) x
             GROUP BY x.lane_key
            HAVING bool_and(x.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))) s;

    IF p_chain AND v_chain IS NOT NULL THEN
        SELECT coalesce(array_agg(s.lane_key), '{}') INTO v_locked
          FROM (SELECT l.lane_key FROM {schema}.action_lane l
                 WHERE l.lane_key = ANY(v_chain)
                 ORDER BY l.lane_key
                   FOR UPDATE SKIP LOCKED) s;
        IF cardinality(v_locked) > 0 THEN
            RETURN QUERY
            SELECT c.op, c.id, c.kind, c.workspace_id, c.lane_key, c.idempotency_key, c.payload,
                   c.subject_account_id, c.state, c.attempt, c.max_attempts, c.epoch,
                   NULL::timestamptz, c.expires_at, c.lease_until, c.write_started_at,
                   NULL::timestamptz, NULL::text, NULL::text, NULL::text, c.created_at
              FROM {schema}.claim_locked_v1(v_locked, p_lease, p_kinds, p_paths, p_suffixes) c;
        END IF;
    END IF;

    -- Every other lane is lowered (never raised) to when it next needs a look.
    RETURN QUERY
    WITH wanted AS (
        SELECT x.lane_key,
               min(CASE WHEN x.state = 'ADMITTED' THEN x.due_at
                        WHEN x.state = 'EXECUTING' THEN x.lease_until
                        ELSE now() END) AS at,
               bool_or(x.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')) AS cleared
          FROM unnest(v_ended) x
         -- An anti-join, hashed: "<> ALL(v_locked)" compared every ended row with every
         -- locked lane (250,000 text comparisons for a batch of 500).
         WHERE NOT EXISTS (SELECT 1 FROM unnest(v_locked) k(lane_key) WHERE k.lane_key = x.lane_key)
         GROUP BY x.lane_key
    ), locked AS (
        SELECT l.lane_key FROM {schema}.action_lane l JOIN wanted w USING (lane_key)
         ORDER BY l.lane_key
           FOR NO KEY UPDATE OF l SKIP LOCKED
    ), lowered AS (
        UPDATE {schema}.action_lane l
           SET next_at = LEAST(l.next_at, w.at),
               head_kind = CASE WHEN w.cleared THEN NULL ELSE l.head_kind END
          FROM wanted w
         WHERE l.lane_key = w.lane_key AND l.lane_key IN (SELECT lane_key FROM locked)
        RETURNING l.lane_key, w.cleared
    )
    SELECT 'lowered', NULL::bigint, NULL::text, NULL::text, d.lane_key, NULL::text,
           NULL::jsonb, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::timestamptz
      FROM lowered d
     WHERE d.cleared
    UNION ALL
    SELECT 'skipped', NULL::bigint, NULL::text, NULL::text, w.lane_key, NULL::text,
           NULL::jsonb, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint,
           w.at, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::text, NULL::text, CASE WHEN w.cleared THEN 'cleared' END, NULL::timestamptz
      FROM wanted w
     WHERE w.lane_key NOT IN (SELECT lane_key FROM lowered)
       AND EXISTS (SELECT 1 FROM {schema}.action_lane l WHERE l.lane_key = w.lane_key);

    RETURN QUERY
    SELECT 'ended', x.id, x.kind, x.workspace_id, x.lane_key, x.idempotency_key, x.payload,
           x.subject_account_id, x.state, x.attempt, x.max_attempts, x.epoch, x.due_at,
           x.expires_at, x.lease_until, x.write_started_at, x.ended_at, x.stop_reason,
           x.readback_ref, x.last_result, x.created_at
      FROM unnest(v_ended) x;
END
$fn$;
