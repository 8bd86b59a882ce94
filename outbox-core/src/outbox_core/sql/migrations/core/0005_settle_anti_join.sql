-- The core line, version 5: settle_v1 again, the same contract, with the lanes it chained
-- left out of the lowering by a hashed anti-join instead of "<> ALL(array)", which compared
-- every ended row with every chained lane. Only the marked statement changed; see
-- 0003_settle.sql for what the function does.

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
               last_result = e.result
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
