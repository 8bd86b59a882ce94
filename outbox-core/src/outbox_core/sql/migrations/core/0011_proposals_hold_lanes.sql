-- The core line, version 11: a proposal holds its lane, and only a claim raises the attempt.
-- Two corrections of shared objects in place, with the same contracts (a replica of an older
-- build calls the same functions and sees the same trigger); only the lines marked
-- "(changed)" differ from 0009 (claim_locked_v1), 0001 (the guard's function) and 0006 (the
-- guard's WHEN clause).
--   * A lane's head is its first live action, and PROPOSED is live ("an admitted action also
--     waits for an earlier action of its lane that has not started"). The claim looked for
--     heads among ADMITTED and EXECUTING only, so an admitted action ran before an earlier
--     proposal of its lane. Now a PROPOSED head is never claimed and holds its lane until it
--     is admitted (the admit query lowers the lane) or refused (cancel lowers it: the next
--     action is claimable at once). Enqueue now gives a proposal's lane its row (queries.sql);
--     the proposals enqueued before this version get theirs below.
--   * The guard let an update at the same epoch raise the attempt: on an executing row whose
--     lease ran out, "state = 'EXECUTING', attempt = attempt + 1, lease_until = ..." passed, a
--     reclaim without a new epoch, after which writes naming the old epoch still applied. Now
--     only a claim (epoch + 1) raises the attempt; an update at the same epoch keeps it or
--     gives one back (a Defer, a shutdown's give-back), and moves the lease only while the
--     action stays EXECUTING (a Reread, a renewal) or clears it on the way back to ADMITTED.
--     The same class of gap, closed too: an update that kept an at-most-once action
--     EXECUTING could clear write_started_at, after which a claim took it again. Now the
--     fence's mark, once set, stays while the state does (a Retry clears it and a Defer
--     restores it on the way back to ADMITTED, as before).
--     The function and the WHEN fast path say the same (tests/test_lifecycle_trigger.py
--     compares them on a grid of updates).

-- The file takes the action table's lock first, in the order every enqueue, claim and
-- settle takes its locks (the action table, then lane rows): the backfill below locks lane
-- rows and the DROP TRIGGER further down needs the table alone, and taken in the other order
-- the two deadlocked with an enqueue that held the table and waited for a lane row (and
-- PostgreSQL chose the enqueue to abort). Enqueues wait for the few statements of this file.
LOCK TABLE {schema}.agent_action IN ACCESS EXCLUSIVE MODE;

-- The proposals enqueued before this version have no lane row of their own, or one whose
-- head_id is above them (enqueue kept head_id at the lowest admitted id): give their lanes a
-- row whose head_id is at or below them, with a look now. The claim that looks then finds the
-- head and sets what it knows.
INSERT INTO {schema}.action_lane AS l (lane_key, next_at, head_id, head_kind)
SELECT a.lane_key, now(), min(a.id), NULL
  FROM {schema}.agent_action a
 WHERE a.state = 'PROPOSED'
 GROUP BY a.lane_key
    ON CONFLICT (lane_key) DO UPDATE
   SET head_id = excluded.head_id, next_at = LEAST(l.next_at, now()), head_kind = NULL
 WHERE excluded.head_id < l.head_id;

-- The second half of every claim (see 0002_claim.sql for what it does): as in 0009, but for
-- the marked lines. It returns the same ops as before: 'proposed' is, like 'wait' and 'busy',
-- only what it decided for the lane row.
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
                 -- (changed) PROPOSED is live: a proposal holds its lane (0010's index).
                 WHERE f.lane_key = l.lane_key AND f.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
                   -- head_id is at or below the lane's lowest live id (enqueue lowers it, a
                   -- claim sets it to the first live action): starting there skips the index
                   -- entries of the lane's ended actions, which a busy lane piles up.
                   AND f.id >= l.head_id
                 ORDER BY f.id LIMIT 1) h ON true
    ), plan AS (
        SELECT c.lane_key, c.first_id, a.id, a.kind, a.state, a.epoch, a.lease_until, a.due_at, a.expires_at,
               a.write_started_at,
               CASE
                 WHEN a.id IS NULL THEN 'empty'
                 WHEN a.id IS DISTINCT FROM coalesce(p_run_now, a.id) THEN 'other'
                 -- (changed) A proposal is never claimed (run_now included), whatever its
                 -- kind or variant, and holds its lane until it is admitted or refused.
                 WHEN a.state = 'PROPOSED' THEN 'proposed'
                 WHEN NOT {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                                                p_kinds, p_paths, p_suffixes) THEN 'foreign'
                 WHEN a.state = 'EXECUTING' AND a.lease_until > now() THEN 'busy'
                 WHEN a.state = 'EXECUTING' AND a.at_most_once
                      AND a.write_started_at IS NOT NULL THEN 'reap_lost'
                 WHEN a.state = 'EXECUTING' AND a.attempt >= a.max_attempts THEN 'reap_exhausted'
                 WHEN a.state = 'EXECUTING' THEN 'reclaim'
                 -- Only an action whose write never started expires: one that waits out a
                 -- deferral after a write that may have reached the provider is claimed and
                 -- reads back, however late; CANCELLED would say it never happened.
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
                   -- Lowered, never raised: a chained claim (settle_v1) reaches a lane whose
                   -- next_at is still the ended head's lease, and a head it may not run (a
                   -- kind outside its chain filter: a kind with a slot limit, one that another
                   -- executor serves, a newer build's) must not wait for that lease.
                   WHEN 'foreign' THEN LEAST(l.next_at, now())
                   WHEN 'other' THEN l.next_at
                   -- (changed) The admission and the refusal lower the lane (the admit query,
                   -- cancel), and so does an erasure; this is the look again if none of them
                   -- does (an older build's erasure of a proposal does not lower its lane).
                   WHEN 'proposed' THEN now() + p_lease
                   WHEN 'busy' THEN p.lease_until
                   WHEN 'claim' THEN now() + p_lease
                   WHEN 'reclaim' THEN now() + p_lease
                   -- An action whose write started does not expire (above).
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

-- The lifecycle, enforced (see 0001_schema.sql): as there, but for the marked lines.
CREATE OR REPLACE FUNCTION {schema}.guard_agent_action() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action %: a new action is PROPOSED or ADMITTED, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
       OR NEW.idempotency_key <> OLD.idempotency_key THEN
        RAISE EXCEPTION 'agent_action %: id, kind, lane and idempotency key never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'agent_action %: the epoch never falls (% to %)', OLD.id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state <> OLD.state AND NOT (OLD.state || '>' || NEW.state) = ANY (ARRAY[
            'PROPOSED>ADMITTED', 'PROPOSED>CANCELLED',
            'ADMITTED>EXECUTING', 'ADMITTED>CANCELLED',
            'EXECUTING>ADMITTED', 'EXECUTING>DONE', 'EXECUTING>UNCERTAIN',
            'EXECUTING>FAILED', 'EXECUTING>CANCELLED']) THEN
        RAISE EXCEPTION 'agent_action %: % may not become %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim (into EXECUTING, or EXECUTING again after the lease ran out) raises the epoch and
    -- the attempt by one. Any other update keeps the epoch.
    IF NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch) THEN
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises the epoch and the attempt by one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.state = 'EXECUTING' AND OLD.lease_until > now() THEN
            RAISE EXCEPTION 'agent_action %: its lease runs until %; it cannot be claimed again before',
                OLD.id, OLD.lease_until USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.at_most_once AND OLD.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action %: an at-most-once action whose write started is never claimed again',
                OLD.id USING ERRCODE = 'check_violation';
        END IF;
    ELSIF NEW.epoch <> OLD.epoch THEN
        RAISE EXCEPTION 'agent_action %: only a claim changes the epoch', OLD.id
            USING ERRCODE = 'check_violation';
    -- (changed) Every other update keeps the epoch, and so it is no claim: it never raises the
    -- attempt (an update that did, on an executing row whose lease ran out, was a reclaim
    -- without a new epoch, under which the old holder's writes still applied). It may give
    -- one attempt back (a Defer, a shutdown's give-back of an unstarted claim), and it moves
    -- the lease only while the action stays EXECUTING (a Reread, a renewal by its holder) or
    -- clears it as the action goes back to ADMITTED (a retry, a deferral).
    ELSIF NEW.attempt > OLD.attempt THEN
        RAISE EXCEPTION 'agent_action %: only a claim (epoch + 1) raises the attempt; this update keeps epoch %',
            OLD.id, OLD.epoch USING ERRCODE = 'check_violation';
    ELSIF NEW.attempt < OLD.attempt - 1 THEN
        RAISE EXCEPTION 'agent_action %: an update gives back one attempt at most (% to %)',
            OLD.id, OLD.attempt, NEW.attempt USING ERRCODE = 'check_violation';
    ELSIF NEW.lease_until IS DISTINCT FROM OLD.lease_until
          AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'EXECUTING')
          AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.lease_until IS NULL) THEN
        RAISE EXCEPTION 'agent_action %: only a claim, or the holder of an action that stays EXECUTING, moves its lease',
            OLD.id USING ERRCODE = 'check_violation';
    -- (changed) The fence's mark stays while the action stays in its state: clearing it on an
    -- executing at-most-once action would let a claim take it again after its write started.
    -- Only the way back to ADMITTED clears it (a Retry: the provider proved it holds nothing)
    -- or restores it (a Defer).
    ELSIF NEW.state = OLD.state AND OLD.write_started_at IS NOT NULL
          AND NEW.write_started_at IS DISTINCT FROM OLD.write_started_at THEN
        RAISE EXCEPTION 'agent_action %: its write started at %; that mark stays while it is %',
            OLD.id, OLD.write_started_at, OLD.state USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: an ended action has a stop_reason', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.payload IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action %: an ended action keeps no payload', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.ended_at IS NULL THEN
            NEW.ended_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;

DROP TRIGGER guard_agent_action ON {schema}.agent_action;

-- As in 0006, but for the marked lines: the WHEN clause holds only for updates that the
-- function would let through unchanged: the identity columns kept, and one of
--   * a claim of an admitted action (epoch and attempt up by one; an at-most-once action only
--     before its write started);
--   * at the same epoch, with the attempt kept or one given back:
--       - an ending of an executing action with a stop reason, no payload, ended_at set and
--         the lease kept;
--       - an update of an executing action that keeps it EXECUTING (a fence, a reread, a
--         renewal) and the fence's mark once set, or returns it to ADMITTED with its lease
--         cleared or kept (a retry, a deferral);
--       - an update of an admitted action that keeps it ADMITTED, its lease and the fence's
--         mark once set (a new due time).
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
          OR (NEW.epoch = OLD.epoch
              -- (changed) no claim: the attempt kept, or one given back
              AND NEW.attempt <= OLD.attempt AND NEW.attempt >= OLD.attempt - 1
              AND ((OLD.state = 'EXECUTING'
                    AND NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                    AND NEW.stop_reason IS NOT NULL AND NEW.payload IS NULL
                    AND NEW.ended_at IS NOT NULL
                    AND NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until)  -- (changed)
                -- (changed) a fence's mark, once set, kept while the state is
                OR (OLD.state = 'EXECUTING' AND NEW.state = 'EXECUTING'
                    AND (OLD.write_started_at IS NULL
                         OR NEW.write_started_at IS NOT DISTINCT FROM OLD.write_started_at))
                -- (changed) back to ADMITTED: the lease cleared or kept, never moved
                OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED'
                    AND (NEW.lease_until IS NULL
                         OR NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until))
                -- (changed) an admitted action keeps its lease (it has none) and its mark
                OR (OLD.state = 'ADMITTED' AND NEW.state = 'ADMITTED'
                    AND NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until
                    AND (OLD.write_started_at IS NULL
                         OR NEW.write_started_at IS NOT DISTINCT FROM OLD.write_started_at))))),
        false))
    EXECUTE FUNCTION {schema}.guard_agent_action();
