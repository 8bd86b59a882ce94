-- The core line, version 2: the claim. Objects that replicas of two builds share during a
-- rolling update carry a version suffix; a changed claim ships as claim_v2 beside claim_v1.

-- Whether this build decodes an action: its kind is one the caller serves, its payload
-- matches that kind's JSON path (derived from the adapter's variants()), and the last segment
-- of its idempotency key matches the kind's suffix pattern, where the kind declares one.
-- NULL path or pattern: that part is not checked. Arrays are aligned by position.
CREATE FUNCTION {schema}.decodable_v1(
    a_kind text, a_payload jsonb, a_key text,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT EXISTS (
        SELECT 1
          FROM unnest(p_kinds, p_paths, p_suffixes) AS f(kind, path, suffix)
         WHERE f.kind = a_kind
           AND (f.path IS NULL OR coalesce(a_payload @@ f.path, false))
           AND (f.suffix IS NULL OR a_key ~ f.suffix))
$fn$;

CREATE TYPE {schema}.claimed_action_v1 AS (
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
    expires_at          timestamptz,
    lease_until         timestamptz,
    write_started_at    timestamptz,
    created_at          timestamptz
);

-- The second half of every claim: the caller already holds the row locks of p_lanes, taken by
-- an earlier statement, so this statement's snapshot sees every action committed into those
-- lanes (an enqueue in progress holds the lane's lock until it commits, and waits for ours).
-- For each lane it looks at one action: the executing holder if there is one, else the first
-- live action by id. That action is
--   'empty'    no live action: the lane row is deleted;
--   'foreign'  this build cannot decode it: left untouched; the lane keeps waiting for it;
--   'busy'     executing under a live lease: the lane is looked at again when the lease ends;
--   'claim'    admitted and due: claimed (epoch and attempt + 1, a lease on the database clock);
--   'reclaim'  executing under an expired lease: claimed again, without waiting on the lane;
--   'reap_lost'/'reap_exhausted'/'expire': returned for the caller to end in its own
--              transaction, where the kind's ended() runs;
--   'wait'     admitted but not due: the lane is looked at again when it falls due;
--   'other'    (run_now only) not the named action: left untouched.
-- A later action of a lane is never looked at while an earlier one lives, which is the lane
-- order, and no statement here walks a lane's backlog.
CREATE FUNCTION {schema}.claim_locked_v1(
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

-- The claim of the scheduled executor: lock up to p_limit lanes that need a look, skipping
-- lanes that another claim, an enqueue or an ending holds, and lanes whose known head this
-- build cannot decode; then, in a new statement, claim their heads. Two statements, not one:
-- one statement's snapshot could predate an ending that committed just before its lock, see
-- the old head still executing, and push the lane's next look out to a lease that is over.
-- Lanes are looked up kind by kind (and then those whose head is not known), each an index
-- range in next_at order, so lanes headed by kinds this executor does not serve are never
-- read. The kinds are taken in a random order each time, so no kind starves the others.
CREATE FUNCTION {schema}.claim_v1(
    p_limit integer, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.claimed_action_v1
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lanes text[] := '{}';
    v_more text[];
    v_kind text;
    v_unknown boolean;
BEGIN
    FOR v_kind, v_unknown IN
        SELECT u.kind, u.unknown
          FROM (SELECT k.kind, false AS unknown, random() AS r FROM unnest(p_kinds) AS k(kind)
                UNION ALL SELECT NULL, true, 0) u
         ORDER BY u.unknown, u.r
    LOOP
        EXIT WHEN cardinality(v_lanes) >= p_limit;
        -- Dynamic SQL, planned for this kind and this limit: a generic plan with a
        -- parameterised LIMIT may walk the whole index.
        EXECUTE format($q$
            SELECT array_agg(s.lane_key)
              FROM (SELECT l.lane_key
                      FROM {schema}.action_lane l
                     WHERE l.head_kind %s AND l.next_at <= now()
                       AND NOT EXISTS (
                             SELECT 1 FROM {schema}.agent_action h
                              WHERE h.id = l.head_id AND h.state IN ('ADMITTED', 'EXECUTING')
                                AND NOT {schema}.decodable_v1(h.kind, h.payload, h.idempotency_key,
                                                              $2, $3, $4))
                     ORDER BY l.next_at
                     LIMIT %s
                       FOR UPDATE OF l SKIP LOCKED) s
            $q$, CASE WHEN v_unknown THEN 'IS NULL' ELSE '= $1' END, p_limit - cardinality(v_lanes))
          INTO v_more
          USING v_kind, p_kinds, p_paths, p_suffixes;
        v_lanes := v_lanes || coalesce(v_more, '{}');
    END LOOP;
    IF cardinality(v_lanes) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM {schema}.claim_locked_v1(
        v_lanes, p_lease, p_kinds, p_paths, p_suffixes);
    -- How many lanes were looked at: when it is p_limit, more may need a look right away.
    RETURN QUERY SELECT 'visited', cardinality(v_lanes)::bigint, NULL::text, NULL::text,
        NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::text, NULL::integer,
        NULL::integer, NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
        NULL::timestamptz;
END
$fn$;

-- run_now: the same claim for one named action, which must be its lane's head. It waits for
-- the lane's lock (an enqueue or another claim holds it only briefly).
CREATE FUNCTION {schema}.claim_action_v1(
    p_id bigint, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.claimed_action_v1
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lane text;
BEGIN
    SELECT l.lane_key INTO v_lane
      FROM {schema}.action_lane l
      JOIN {schema}.agent_action a ON a.lane_key = l.lane_key
     WHERE a.id = p_id
       FOR UPDATE OF l;
    IF v_lane IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM {schema}.claim_locked_v1(
        ARRAY[v_lane], p_lease, p_kinds, p_paths, p_suffixes, p_id);
END
$fn$;
