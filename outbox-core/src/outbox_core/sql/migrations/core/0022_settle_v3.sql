-- The core line, version 22: settle_v3, a settle that reads back only what its caller uses, and
-- a correction of how every settle lowers the lanes it does not chain (issue 34).
--   * settle_v3: settle_v2 with one more parameter, p_full. Without it an ended action comes
--     back as its id and attempt only (the executor knows the rest from its own ending: a
--     batch whose kinds have no ended()/rescheduled() hook); with it, as the whole row. settle_v2
--     kept every changed row whole in an array of agent_action rows and read it three times (the
--     chained lanes, the lanes to lower, the answer): about a tenth of a settle's time, for rows
--     that the executor then dropped in all but the hooked batches.
--   * The lanes a settle lowers (a retry, a deferral, a reread, a lane whose next head it does
--     not claim): the update found each lane's lock by a nested scan of the locked lanes, which
--     the planner of these generic plans chose for the few rows it expects, and a batch of 500
--     lanes made 125,000 comparisons (17 % of the server's time in a no-op burn-down). The lock
--     now carries the time and the head's ending to the update (corrected in lower_lanes of
--     queries.sql too).
--   * settle_v2 is restated in place, with its contract, as settle_v3 with p_full: a replica of
--     an older build settles as before, through the corrected lowering. settle_v1 calls
--     settle_v2 and is unchanged.
CREATE FUNCTION {schema}.settle_v3(
    p_ids bigint[], p_epochs bigint[], p_from_states text[], p_states text[],
    p_stop_reasons text[], p_readback_refs text[], p_delays float8[], p_fences text[],
    p_prior_writes timestamptz[], p_uncounts integer[], p_results text[], p_details text[],
    p_chain boolean, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[],
    p_full boolean
) RETURNS SETOF {schema}.settled_v2
LANGUAGE plpgsql
-- Plan once, not on every call: planning these statements cost more than running them for
-- the one-lane batches a busy lane sends, and the generic plan is as good for large ones.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_attempts integer[];
    v_lanes text[];
    v_states text[];
    v_at timestamptz[];
    v_chain text[];
    v_locked text[] := '{}';
BEGIN
    -- The endings, each only while its action is still in the state and at the epoch its
    -- attempt saw; what the rest of the function needs of each changed action.
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
               -- The attempt's detail, or NULL: a detail describes its own result only.
               last_detail = e.detail,
               -- Set here, not by the guard's function, so that an ending takes the
               -- guard's fast path.
               ended_at = CASE WHEN e.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                               THEN now() ELSE a.ended_at END
          FROM unnest(p_ids, p_epochs, p_from_states, p_states, p_stop_reasons,
                      p_readback_refs, p_delays, p_fences, p_prior_writes, p_uncounts,
                      p_results, p_details)
               AS e(id, epoch, from_state, state, stop_reason, readback_ref, delay, fence,
                    prior_write, uncount, result, detail)
         WHERE a.id = e.id AND a.epoch = e.epoch AND a.state = e.from_state
        RETURNING a.id, a.attempt, a.lane_key, a.state,
                  -- When the action's lane next needs a look for it (an ended one: now).
                  CASE WHEN a.state = 'ADMITTED' THEN a.due_at
                       WHEN a.state = 'EXECUTING' THEN a.lease_until
                       ELSE now() END AS at
    )
    SELECT array_agg(c.id), array_agg(c.attempt), array_agg(c.lane_key), array_agg(c.state),
           array_agg(c.at)
      INTO v_ids, v_attempts, v_lanes, v_states, v_at
      FROM changed c;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- Lanes whose every changed action ended: their heads are gone.
    SELECT array_agg(s.lane_key ORDER BY s.lane_key) INTO v_chain
      FROM (SELECT x.lane_key FROM unnest(v_lanes, v_states) AS x(lane_key, state)
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
                   NULL::timestamptz, NULL::text, NULL::text, NULL::text, c.created_at, NULL::text
              FROM {schema}.claim_locked_v1(v_locked, p_lease, p_kinds, p_paths, p_suffixes) c;
        END IF;
    END IF;

    -- Every other lane is lowered (never raised) to when it next needs a look.
    RETURN QUERY
    WITH wanted AS (
        SELECT x.lane_key, min(x.at) AS at,
               bool_or(x.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')) AS cleared
          FROM unnest(v_lanes, v_states, v_at) AS x(lane_key, state, at)
         -- An anti-join, hashed: "<> ALL(v_locked)" compared every ended row with every
         -- locked lane (250,000 text comparisons for a batch of 500).
         WHERE NOT EXISTS (SELECT 1 FROM unnest(v_locked) k(lane_key) WHERE k.lane_key = x.lane_key)
         GROUP BY x.lane_key
    ), locked AS (
        -- Each lane with what it is lowered to: the update below finds its row by the lane's
        -- key (one index probe a lane), not by looking for it among the locked ones.
        SELECT l.lane_key, w.at, w.cleared
          FROM {schema}.action_lane l JOIN wanted w USING (lane_key)
         ORDER BY l.lane_key
           FOR NO KEY UPDATE OF l SKIP LOCKED
    ), lowered AS (
        UPDATE {schema}.action_lane l
           SET next_at = LEAST(l.next_at, k.at),
               head_kind = CASE WHEN k.cleared THEN NULL ELSE l.head_kind END
          FROM locked k
         WHERE l.lane_key = k.lane_key
        RETURNING l.lane_key, k.cleared
    )
    SELECT 'lowered', NULL::bigint, NULL::text, NULL::text, d.lane_key, NULL::text,
           NULL::jsonb, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint,
           NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text
      FROM lowered d
     WHERE d.cleared
    UNION ALL
    SELECT 'skipped', NULL::bigint, NULL::text, NULL::text, w.lane_key, NULL::text,
           NULL::jsonb, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::bigint,
           w.at, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
           NULL::text, NULL::text, CASE WHEN w.cleared THEN 'cleared' END, NULL::timestamptz,
           NULL::text
      FROM wanted w
     WHERE w.lane_key NOT IN (SELECT lane_key FROM lowered)
       AND EXISTS (SELECT 1 FROM {schema}.action_lane l WHERE l.lane_key = w.lane_key);

    IF NOT p_full THEN
        RETURN QUERY
        SELECT 'ended', x.id, NULL::text, NULL::text, NULL::text, NULL::text, NULL::jsonb,
               NULL::text, NULL::text, x.attempt, NULL::integer, NULL::bigint,
               NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
               NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::timestamptz,
               NULL::text
          FROM unnest(v_ids, v_attempts) AS x(id, attempt);
        RETURN;
    END IF;
    -- The rows as this transaction left them (a chained claim takes other actions than these).
    RETURN QUERY
    SELECT 'ended', a.id, a.kind, a.workspace_id, a.lane_key, a.idempotency_key, a.payload,
           a.subject_account_id, a.state, a.attempt, a.max_attempts, a.epoch, a.due_at,
           a.expires_at, a.lease_until, a.write_started_at, a.ended_at, a.stop_reason,
           a.readback_ref, a.last_result, a.created_at, a.last_detail
      FROM {schema}.agent_action a
     WHERE a.id = ANY(v_ids);
END
$fn$;

-- settle_v2 for the replicas of builds before this version: the same call, every ended action
-- whole.
CREATE OR REPLACE FUNCTION {schema}.settle_v2(
    p_ids bigint[], p_epochs bigint[], p_from_states text[], p_states text[],
    p_stop_reasons text[], p_readback_refs text[], p_delays float8[], p_fences text[],
    p_prior_writes timestamptz[], p_uncounts integer[], p_results text[], p_details text[],
    p_chain boolean, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.settled_v2
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY
    SELECT * FROM {schema}.settle_v3(p_ids, p_epochs, p_from_states, p_states, p_stop_reasons,
                                     p_readback_refs, p_delays, p_fences, p_prior_writes,
                                     p_uncounts, p_results, p_details, p_chain, p_lease,
                                     p_kinds, p_paths, p_suffixes, true);
END
$fn$;
