-- The core line, version 20: the rules that indexes on `state` kept move to two small tables,
-- so that a claim and an ending can be HOT updates (issue 34). Version 21 then drops those
-- indexes; until it runs both forms hold, so this file changes nothing a replica of an older
-- build relies on.
--
-- Why: a claim and an ending change `state` (an ending `ended_at` too), and PostgreSQL makes an
-- update HOT (a new row version on the same page, no index entry) only when no index names a
-- column it changes, its predicate included. The executing-lane, live-lane, expiry, ended and
-- uncertain indexes all named `state` or `ended_at`, so every claim and every ending wrote an
-- entry into each of the table's eight indexes: 14 B-tree entries and 2,100 bytes of WAL an
-- action (docs/benchmarks.md, "HOT claims and endings").
--
--   * action_executing: one row per EXECUTING action, its lane's key unique. Its primary key
--     takes the specification's name, ux_agent_action_lane_executing: it is what allows one
--     executing action per lane, also when two replicas claim at once, in every isolation
--     level (a unique index, checked as the row is inserted). The partial unique index on
--     agent_action that held the rule until now is renamed (its name was this one) and
--     dropped by version 21.
--   * hold_lanes, a statement trigger on agent_action, keeps it: after each UPDATE statement,
--     its actions that left EXECUTING free their lanes' rows, then those that entered
--     EXECUTING insert theirs (a lane that another action holds: the unique index's error, as
--     before). One call per statement, set-based: a claim or a settle of 500 actions costs one
--     call, where a row trigger cost 500 (docs/benchmarks.md). The delete of an executing
--     action (an erasure) frees its lane by a row trigger whose WHEN clause lets every other
--     delete (retention) pass without a call; a TRUNCATE of agent_action empties both tables.
--   * keep_lane_holders refuses a write to action_executing that is not one of those triggers'
--     (pg_trigger_depth() = 0): a row deleted or changed by hand would let a second action of
--     the lane execute, where the unique index it replaces could not be written around.
--   * action_failure: one row per action that ended FAILED or UNCERTAIN (kind, state, when), for
--     the uncertain gauge, `outbox status` and the dashboard, which read the index of UNCERTAIN
--     actions and the index of ended actions until now. A row trigger whose WHEN clause holds
--     only when an action enters or leaves one of those states keeps it: a DONE costs nothing.
--   * claim_locked_v1 (changed in place, same contract: every replica calls it) reads a lane's
--     executing action from action_executing.
--
-- The file takes the action table's lock first (as 0011), SHARE ROW EXCLUSIVE, which CREATE
-- TRIGGER needs anyway: enqueues, claims and endings wait for the few statements below, and the
-- executing and failed actions copied into the new tables are all there are when it commits.
LOCK TABLE {schema}.agent_action IN SHARE ROW EXCLUSIVE MODE;

ALTER INDEX {schema}.ux_agent_action_lane_executing RENAME TO ux_agent_action_lane_executing_old;

CREATE TABLE {schema}.action_executing (
    lane_key   text CONSTRAINT ux_agent_action_lane_executing PRIMARY KEY,
    action_id  bigint NOT NULL
);

COMMENT ON TABLE {schema}.action_executing IS
    'One row per EXECUTING action of agent_action, its lane unique; written only by agent_action''s triggers';

INSERT INTO {schema}.action_executing (lane_key, action_id)
SELECT lane_key, id FROM {schema}.agent_action WHERE state = 'EXECUTING';

-- The actions of an UPDATE statement that left EXECUTING free their lanes first (an ending,
-- a retry, a deferral), then those that entered it take theirs: a statement may end a lane's
-- holder and claim the next action (by hand), and a settle's chained claims come in a later
-- statement of its transaction. An action that was EXECUTING already (a reclaim, a fence, a
-- reread, a renewal) holds its row and is left alone.
CREATE FUNCTION {schema}.hold_lanes() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.action_executing x
     USING changed_actions n
     WHERE n.state <> 'EXECUTING' AND x.lane_key = n.lane_key AND x.action_id = n.id;
    INSERT INTO {schema}.action_executing (lane_key, action_id)
    SELECT n.lane_key, n.id
      FROM changed_actions n
     WHERE n.state = 'EXECUTING'
       AND NOT EXISTS (SELECT 1 FROM {schema}.action_executing x
                        WHERE x.lane_key = n.lane_key AND x.action_id = n.id);
    RETURN NULL;
END
$fn$;

CREATE TRIGGER hold_lanes
    AFTER UPDATE ON {schema}.agent_action
    REFERENCING NEW TABLE AS changed_actions
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.hold_lanes();

-- An executing action deleted (an erasure): its lane is free. The WHEN clause keeps every
-- other delete (retention's, of ended actions) free of a PL/pgSQL call.
CREATE FUNCTION {schema}.free_lane() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.action_executing WHERE lane_key = OLD.lane_key AND action_id = OLD.id;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER free_lane
    AFTER DELETE ON {schema}.agent_action
    FOR EACH ROW WHEN (OLD.state = 'EXECUTING')
    EXECUTE FUNCTION {schema}.free_lane();

CREATE FUNCTION {schema}.free_all_lanes() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.action_executing;
    DELETE FROM {schema}.action_failure;
    RETURN NULL;
END
$fn$;

-- What a hand-written write to action_executing could do: free a lane whose action still
-- executes (a delete, a changed key or action), after which a second action of the lane could
-- execute. Only the triggers above write it.
CREATE FUNCTION {schema}.keep_lane_holders() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'action_executing is written only by agent_action''s triggers (% refused): it holds the lanes of the EXECUTING actions', TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'Change the action in agent_action instead; its trigger keeps this table.';
END
$fn$;

CREATE TRIGGER keep_lane_holders
    BEFORE INSERT OR UPDATE OR DELETE ON {schema}.action_executing
    FOR EACH ROW WHEN (pg_trigger_depth() = 0)
    EXECUTE FUNCTION {schema}.keep_lane_holders();

CREATE TRIGGER keep_lane_holders_table
    BEFORE TRUNCATE ON {schema}.action_executing
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.keep_lane_holders();

-- The actions that ended FAILED or UNCERTAIN, for the readers that look only at those.
CREATE TABLE {schema}.action_failure (
    action_id  bigint PRIMARY KEY,
    kind       text NOT NULL,
    state      text NOT NULL CHECK (state IN ('FAILED', 'UNCERTAIN')),
    ended_at   timestamptz NOT NULL
);

CREATE INDEX ix_action_failure_ended ON {schema}.action_failure (ended_at);

CREATE INDEX ix_action_failure_uncertain ON {schema}.action_failure (kind) WHERE state = 'UNCERTAIN';

COMMENT ON TABLE {schema}.action_failure IS
    'One row per action of agent_action that ended FAILED or UNCERTAIN; kept by agent_action''s triggers';

INSERT INTO {schema}.action_failure (action_id, kind, state, ended_at)
SELECT id, kind, state, coalesce(ended_at, now()) FROM {schema}.agent_action WHERE state IN ('FAILED', 'UNCERTAIN');

-- An action entering FAILED or UNCERTAIN (an ending, an operator's resolution of an UNCERTAIN
-- one as not done), or leaving them (a resolution as done, a read-back again), or deleted in
-- one of them.
CREATE FUNCTION {schema}.track_failure() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IN ('FAILED', 'UNCERTAIN') THEN
        INSERT INTO {schema}.action_failure (action_id, kind, state, ended_at)
        VALUES (NEW.id, NEW.kind, NEW.state, coalesce(NEW.ended_at, now()))
        ON CONFLICT (action_id) DO UPDATE
           SET state = excluded.state, ended_at = excluded.ended_at;
    ELSE
        DELETE FROM {schema}.action_failure WHERE action_id = OLD.id;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER track_failure
    AFTER UPDATE ON {schema}.agent_action
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND (OLD.state IN ('FAILED', 'UNCERTAIN') OR NEW.state IN ('FAILED', 'UNCERTAIN')))
    EXECUTE FUNCTION {schema}.track_failure();

CREATE TRIGGER track_failure_delete
    AFTER DELETE ON {schema}.agent_action
    FOR EACH ROW WHEN (OLD.state IN ('FAILED', 'UNCERTAIN'))
    EXECUTE FUNCTION {schema}.track_failure();

CREATE TRIGGER free_all_lanes
    AFTER TRUNCATE ON {schema}.agent_action
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.free_all_lanes();

-- claim_locked_v1 as 0011 left it, but for the lane's executing action (changed): read from
-- action_executing, one probe of its primary key, where the partial index of executing actions
-- served before. The head search walks ix_agent_action_lane_id, (lane_key, id) for every row,
-- from head_id on (version 21 drops the index of live actions it walked before).
CREATE OR REPLACE FUNCTION {schema}.claim_locked_v1(
    p_lanes text[], p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[],
    p_run_now bigint DEFAULT NULL
) RETURNS SETOF {schema}.claimed_action_v1
LANGUAGE plpgsql
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
        SELECT l.lane_key, coalesce(x.action_id, h.id) AS id, h.id AS first_id
          FROM lanes l
          -- (changed) The lane's executing action, if any.
          LEFT JOIN {schema}.action_executing x ON x.lane_key = l.lane_key
          LEFT JOIN LATERAL (
                SELECT f.id FROM {schema}.agent_action f
                 -- PROPOSED is live: a proposal holds its lane. The state test is a CASE: the
                 -- planner cannot estimate it, and takes its default (one row in two) instead
                 -- of the state's rarity among the kept ended actions, for which it chose to
                 -- read and sort every action of the lane from head_id on (its whole backlog)
                 -- rather than walk the index in id order to the first live one (migration 0020).
                 WHERE f.lane_key = l.lane_key
                   AND CASE WHEN f.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN true END
                   AND f.id >= l.head_id
                 ORDER BY f.id LIMIT 1) h ON true
    ), plan AS (
        SELECT c.lane_key, c.first_id, a.id, a.kind, a.state, a.epoch, a.lease_until, a.due_at, a.expires_at,
               a.write_started_at,
               CASE
                 WHEN a.id IS NULL THEN 'empty'
                 WHEN a.id IS DISTINCT FROM coalesce(p_run_now, a.id) THEN 'other'
                 WHEN a.state = 'PROPOSED' THEN 'proposed'
                 WHEN NOT {schema}.decodable_v1(a.kind, a.payload, a.idempotency_key,
                                                p_kinds, p_paths, p_suffixes) THEN 'foreign'
                 WHEN a.state = 'EXECUTING' AND a.lease_until > now() THEN 'busy'
                 WHEN a.state = 'EXECUTING' AND a.at_most_once
                      AND a.write_started_at IS NOT NULL THEN 'reap_lost'
                 WHEN a.state = 'EXECUTING' AND a.attempt >= a.max_attempts THEN 'reap_exhausted'
                 WHEN a.state = 'EXECUTING' THEN 'reclaim'
                 WHEN a.expires_at <= now() AND a.write_started_at IS NULL THEN 'expire'
                 WHEN a.due_at <= now() OR a.id = p_run_now THEN 'claim'
                 ELSE 'wait'
               END AS op
          FROM cur c
          LEFT JOIN {schema}.agent_action a ON a.id = c.id
    ), claimed AS (
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
                   WHEN 'foreign' THEN LEAST(l.next_at, now())
                   WHEN 'other' THEN l.next_at
                   WHEN 'proposed' THEN now() + p_lease
                   WHEN 'busy' THEN p.lease_until
                   WHEN 'claim' THEN now() + p_lease
                   WHEN 'reclaim' THEN now() + p_lease
                   WHEN 'wait' THEN CASE WHEN p.write_started_at IS NULL
                                         THEN LEAST(p.due_at, p.expires_at)
                                         ELSE p.due_at END
                   ELSE now() + interval '30 seconds'
               END
          FROM plan p
         WHERE l.lane_key = p.lane_key AND p.op <> 'empty'
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
