-- The core line, version 13: the last attempt's detail kept on the action (issue 21).
--   * agent_action.last_detail: why the last attempt came out as last_result says, in the
--     adapter's words (a provider's code and a short reason; never the payload, an address or
--     a token: outbox_core/results.py). Nullable and without a default, so the column is
--     added without rewriting the table, and an insert of an older build (which names its
--     columns) leaves it NULL.
--   * settle_v2: settle_v1 with one more array, p_details, written with each ending
--     (last_detail = NULL where an ending has none: a detail describes its own result only),
--     returning settled_v2, settled_v1 with last_detail after created_at. It differs from
--     settle_v1 as 0006 left it in the lines marked "(new)" and in the last column of each row
--     it returns (NULL but for the 'ended' rows).
--   * settle_v1 restated in place with the same contract, as a call of settle_v2 without
--     details: a replica of an older build settles exactly as before, and its endings clear
--     a detail an earlier attempt left, so an action never shows one result with another
--     result's detail.
-- The guard trigger and its function are untouched: they read none of the new column, and
-- an ended row stays immutable, its detail included.

ALTER TABLE {schema}.agent_action ADD COLUMN last_detail text;

CREATE TYPE {schema}.settled_v2 AS (
    op                  text,
    id                  bigint,
    kind                text,
    workspace_id        text,
    lane_key            text,
    idempotency_key     text,
    payload             jsonb,
    subject_account_id  text,
    state               text,
    attempt             integer,
    max_attempts        integer,
    epoch               bigint,
    due_at              timestamptz,
    expires_at          timestamptz,
    lease_until         timestamptz,
    write_started_at    timestamptz,
    ended_at            timestamptz,
    stop_reason         text,
    readback_ref        text,
    last_result         text,
    created_at          timestamptz,
    last_detail         text
);

-- The endings of a batch, as settle_v1, each with its detail.
CREATE FUNCTION {schema}.settle_v2(
    p_ids bigint[], p_epochs bigint[], p_from_states text[], p_states text[],
    p_stop_reasons text[], p_readback_refs text[], p_delays float8[], p_fences text[],
    -- (new) p_details
    p_prior_writes timestamptz[], p_uncounts integer[], p_results text[], p_details text[],
    p_chain boolean, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.settled_v2
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
               -- (new) The attempt's detail, or NULL: a detail describes its own result only.
               last_detail = e.detail,
               -- Set here, not by the guard's function, so that an ending takes the
               -- guard's fast path.
               ended_at = CASE WHEN e.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                               THEN now() ELSE a.ended_at END
          FROM unnest(p_ids, p_epochs, p_from_states, p_states, p_stop_reasons,
                      p_readback_refs, p_delays, p_fences, p_prior_writes, p_uncounts,
                      p_results, p_details)  -- (new) p_details
               AS e(id, epoch, from_state, state, stop_reason, readback_ref, delay, fence,
                    prior_write, uncount, result, detail)  -- (new) detail
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
                   NULL::timestamptz, NULL::text, NULL::text, NULL::text, c.created_at, NULL::text
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

    RETURN QUERY
    SELECT 'ended', x.id, x.kind, x.workspace_id, x.lane_key, x.idempotency_key, x.payload,
           x.subject_account_id, x.state, x.attempt, x.max_attempts, x.epoch, x.due_at,
           x.expires_at, x.lease_until, x.write_started_at, x.ended_at, x.stop_reason,
           x.readback_ref, x.last_result, x.created_at, x.last_detail
      FROM unnest(v_ended) x;
END
$fn$;

-- settle_v1: settle_v2 without details, for replicas of older builds.
CREATE OR REPLACE FUNCTION {schema}.settle_v1(
    p_ids bigint[], p_epochs bigint[], p_from_states text[], p_states text[],
    p_stop_reasons text[], p_readback_refs text[], p_delays float8[], p_fences text[],
    p_prior_writes timestamptz[], p_uncounts integer[], p_results text[],
    p_chain boolean, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.settled_v1
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN QUERY
    SELECT s.op, s.id, s.kind, s.workspace_id, s.lane_key, s.idempotency_key, s.payload,
           s.subject_account_id, s.state, s.attempt, s.max_attempts, s.epoch, s.due_at,
           s.expires_at, s.lease_until, s.write_started_at, s.ended_at, s.stop_reason,
           s.readback_ref, s.last_result, s.created_at
      FROM {schema}.settle_v2(p_ids, p_epochs, p_from_states, p_states, p_stop_reasons,
                              p_readback_refs, p_delays, p_fences, p_prior_writes, p_uncounts,
                              p_results, NULL::text[], p_chain, p_lease,
                              p_kinds, p_paths, p_suffixes) s;
END
$fn$;
