-- The core line, version 9: claim_locked_v1 restated (from 0006) for two corrections, with the
-- same contract (a replica of an older build calls the same function). Only the lines marked
-- "(changed)" differ from 0006.
--   * A lane whose next head this claim leaves alone ('foreign') gets next_at lowered to now,
--     not kept. A chained claim (settle_v1, after the lane's head ended) found next_at still at
--     the ended head's lease, so a next head of a kind outside the chain's filter waited out that
--     lease (300 s by default): every lane of a kind with a slot limit ran one action per lease,
--     and so did a lane whose kinds two executors (`outbox run --kinds`) split between them.
--   * An admitted action whose write started (a deferral after a Reread keeps the fence) is no
--     longer ended CANCELLED/EXPIRED: the effect may exist, so it is claimed and read back.

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
               a.write_started_at,  -- (changed)
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
                 -- (changed) Only an action whose write never started expires: one that waits
                 -- out a deferral after a write that may have reached the provider is claimed
                 -- and reads back, however late; CANCELLED would say it never happened.
                 WHEN a.expires_at <= now() AND a.write_started_at IS NULL THEN 'expire'
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
                   -- (changed) Lowered, never raised: a chained claim (settle_v1) reaches a lane
                   -- whose next_at is still the ended head's lease, and a head it may not run
                   -- (a kind outside its chain filter: a kind with a slot limit, one that
                   -- another executor serves, a newer build's) must not wait for that lease.
                   WHEN 'foreign' THEN LEAST(l.next_at, now())
                   WHEN 'other' THEN l.next_at
                   WHEN 'busy' THEN p.lease_until
                   WHEN 'claim' THEN now() + p_lease
                   WHEN 'reclaim' THEN now() + p_lease
                   -- (changed) An action whose write started does not expire (above).
                   WHEN 'wait' THEN CASE WHEN p.write_started_at IS NULL
                                         THEN LEAST(p.due_at, p.expires_at)
                                         ELSE p.due_at END
                   -- reap and expire: the caller ends the action now, and its ending lowers
                   -- next_at; this is the look again if that ending never comes.
                   ELSE now() + interval '30 seconds'
               END
          FROM plan p
         WHERE l.lane_key = p.lane_key AND p.op <> 'empty'
           -- A claim leaves a lane row alone that already says what it must: the
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
