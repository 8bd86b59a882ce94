-- outbox-core: the current schema, in one file, for readers.
--
-- What the core's migrations (sql/migrations/core/0001_schema.sql onward) build, object by
-- object, as it stands after the last of them: the tables, their indexes, the lifecycle
-- trigger, the claim and the settle. The migrations restate a function each time they change
-- it; here each object appears once, in the version that runs. Why it works the way it does:
-- docs/design/claim.md.
--
-- This file builds nothing in production. `outbox migrate` (and `outbox migrate --print`)
-- apply the numbered migrations, which are the only way a database is built; this file is for
-- reading, and for tests/test_schema_sql.py, which builds one database from the migrations and
-- one from this file and fails, with a diff, when their objects differ (columns, defaults,
-- constraints, table options, indexes, triggers, types, comments, function signatures and
-- bodies; comments inside a function body are not compared). `{schema}` stands for the
-- configured schema (`outbox` by default) and is filled in as in the migrations.
--
-- Updating it: every migration that changes an object changes it here too, in the same
-- commit, at the object's place in this file (a changed function: its whole new text
-- replaces the old one; a new object: in the section it belongs to; a dropped one: removed).
-- A function restated in a migration is created here with CREATE FUNCTION, not CREATE OR
-- REPLACE; a migration's "(changed)" markers stay in the migration. Then run
--     python -m pytest outbox-core/tests/test_schema_sql.py
-- Its diff reads "-" for what the migrations build and "+" for what this file builds.
--
-- Contents, in this order:
--   1. the schema
--   2. action_kind        the kind registry
--   3. agent_action       the actions, and their indexes
--   4. action_lane        one row per lane with live actions: what the claim walks;
--      action_executing   one row per EXECUTING action, one a lane (the lane rule)
--   5. guard_agent_action the lifecycle, enforced by a trigger
--   6. decodable_v1       whether this build decodes an action (rolling updates)
--   7. claim_v1, claim_action_v1, claim_locked_v1 and their row type claimed_action_v1
--   8. settle_v3          the endings of a batch of attempts, and its row type settled_v2;
--                         settle_v2, settle_v1 (and settled_v1) for replicas of older builds
--   9. schema_migration   what `outbox migrate` has applied
--  10. executor_waiting   the executors waiting for a wake-up, and wake_wanted_v1
--  11. action_audit       the operator's changes of an action; action_kept_payload, what an
--                         operator runs again
--  12. action_failure     the actions that ended FAILED or UNCERTAIN
--
-- Objects that replicas of two builds share during a rolling update carry a version suffix
-- (claim_v1); a changed contract ships under a new name beside the old one, while a
-- correction with the same contract replaces a function in place (docs/rolling-updates.md).

-- 1. The schema -----------------------------------------------------------------------------
-- `outbox migrate` creates it (with its bookkeeping table, section 9) before the first file.
CREATE SCHEMA IF NOT EXISTS {schema};

-- 2. The kind registry ----------------------------------------------------------------------
-- Kinds are registered rows, not a CHECK list: each package's migration line inserts its own
-- kinds, so a plugin never edits a constraint that names other plugins' kinds, and an older
-- replica running its migrations never removes a newer kind. The core registers none.
CREATE TABLE {schema}.action_kind (
    kind            text PRIMARY KEY CHECK (kind ~ '^[A-Z][A-Z0-9_]*$'),
    at_most_once    boolean NOT NULL,
    instance_level  boolean NOT NULL,
    line            text NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, at_most_once, instance_level)
);

-- 3. The actions ----------------------------------------------------------------------------
-- One row per action, from enqueue to its deletion by retention (an erasure deletes live ones
-- too). The lifecycle of `state` is in section 5; the columns every reader selects are
-- ACTION_COLUMNS in outbox_core/action.py.
--
-- HOT updates (migration 0021): no index of this table names a column that a claim, a fence or
-- an ending changes (`state`, `ended_at`, the lease, the epoch, ...), so each of them writes a
-- new row version on the row's own page and no index entry, when the page has room. The rules
-- that indexes on `state` kept live in small tables their triggers keep: one executing action
-- per lane in action_executing (section 4), the failed and uncertain actions in action_failure
-- (section 12). fillfactor 50: room for a claim's and an ending's versions beside the row until
-- pruning frees the dead ones (docs/benchmarks.md, "HOT claims and endings").
CREATE TABLE {schema}.agent_action (
    id                  bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    kind                text NOT NULL,
    -- Copies of the kind's flags. check_agent_action_kind (below) proves they are the
    -- registry's, so the trigger and the CHECKs read them from the row instead of looking the
    -- kind up.
    at_most_once        boolean NOT NULL,
    instance_level      boolean NOT NULL,
    workspace_id        text,
    lane_key            text NOT NULL CHECK (lane_key <> ''),
    idempotency_key     text NOT NULL CHECK (idempotency_key <> ''),
    payload             jsonb,
    subject_account_id  text,
    state               text NOT NULL DEFAULT 'ADMITTED',
    attempt             integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        integer NOT NULL CHECK (max_attempts >= 1),
    epoch               bigint NOT NULL DEFAULT 0,
    due_at              timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz,
    lease_until         timestamptz,
    write_started_at    timestamptz,
    ended_at            timestamptz,
    stop_reason         text,
    readback_ref        text,
    last_result         text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- Why the last attempt came out as last_result says, in the adapter's words (migration
    -- 0013, so after created_at): a provider's code and a short reason, never the payload.
    last_detail         text,
    -- The span active at enqueue (migration 0014): outbox_core/tracing.py.
    trace_context       jsonb,
    CONSTRAINT ck_agent_action_state CHECK (
        state IN ('PROPOSED', 'ADMITTED', 'EXECUTING', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')),
    CONSTRAINT ck_agent_action_workspace CHECK (instance_level OR workspace_id IS NOT NULL)
) WITH (fillfactor = 50);

COMMENT ON COLUMN {schema}.agent_action.trace_context IS
    'W3C trace context (traceparent, tracestate) of the span active at enqueue; NULL without one';

-- The action's indexes. None names a column that a claim or an ending changes (see above):
-- the claim reads a lane's head through ix_agent_action_lane_id from the lane row's head_id
-- (docs/design/claim.md, "How"), and its executing action from action_executing.
CREATE UNIQUE INDEX ux_agent_action_idempotency_key ON {schema}.agent_action (idempotency_key);

-- Every action with an expiry, the ended ones too until retention deletes them: the expiry
-- sweep reads the expiries that came due since its last pass (migration 0021).
CREATE INDEX ix_agent_action_expires_at
    ON {schema}.agent_action (expires_at) WHERE expires_at IS NOT NULL;

-- The search's indexes (outbox_core/search.py, migration 0019, built CONCURRENTLY there): a
-- search walks one of them in id order, newest first, from its cursor. (subject_account_id,
-- id) also serves erasure's equality; it replaced an index on subject_account_id alone.
-- (kind, id) serves retention, kind by kind, oldest first; (lane_key, id) the claim's search for
-- a lane's head and the reads of a lane.
CREATE INDEX ix_agent_action_kind_id ON {schema}.agent_action (kind, id);

CREATE INDEX ix_agent_action_lane_id ON {schema}.agent_action (lane_key, id);

CREATE INDEX ix_agent_action_workspace_id
    ON {schema}.agent_action (workspace_id, id) WHERE workspace_id IS NOT NULL;

CREATE INDEX ix_agent_action_subject_id
    ON {schema}.agent_action (subject_account_id, id) WHERE subject_account_id IS NOT NULL;

-- A key prefix is a range of the C collation's order, whatever the database's collation.
CREATE INDEX ix_agent_action_key_c
    ON {schema}.agent_action (idempotency_key COLLATE "C");

-- Every action's kind is registered with its flags (migration 0015): checked once per
-- statement, for every writer (enqueue, raw SQL, COPY), by looking up the statement's distinct
-- kinds in the registry; a foreign key did it row by row, with a lock on the kind's row
-- (docs/benchmarks.md, issue 23). An action's kind and flags never change, and the registry
-- only grows: no kind is deleted, changed or truncated away.
CREATE FUNCTION {schema}.check_action_kinds() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    missing record;
BEGIN
    SELECT n.kind, n.at_most_once, n.instance_level INTO missing
      FROM (SELECT DISTINCT kind, at_most_once, instance_level FROM inserted) n
     WHERE NOT EXISTS (
               SELECT 1 FROM {schema}.action_kind k
                WHERE k.kind = n.kind AND k.at_most_once = n.at_most_once
                  AND k.instance_level = n.instance_level)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert into agent_action violates fk_agent_action_kind: (kind, '
            'at_most_once, instance_level) = (%, %, %) is not a registered kind',
            missing.kind, missing.at_most_once, missing.instance_level
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'fk_agent_action_kind',
                  TABLE = 'agent_action', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER check_agent_action_kind
    AFTER INSERT ON {schema}.agent_action
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.check_action_kinds();

-- Refuses what the WHEN clause of its trigger lets through (a change the registry never
-- makes), naming the table.
CREATE FUNCTION {schema}.refuse_kind_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_TABLE_NAME = 'agent_action' THEN
        RAISE EXCEPTION 'agent_action %: its kind and the kind''s flags never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_LEVEL = 'STATEMENT' THEN
        RAISE EXCEPTION 'action_kind: kinds are only ever added; TRUNCATE refused'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RAISE EXCEPTION 'action_kind: kinds are only ever added; % of kind % refused', TG_OP, OLD.kind
        USING ERRCODE = 'restrict_violation';
END
$fn$;

CREATE TRIGGER guard_agent_action_kind
    BEFORE UPDATE OF kind, at_most_once, instance_level ON {schema}.agent_action
    FOR EACH ROW WHEN (NEW.kind IS DISTINCT FROM OLD.kind
                       OR NEW.at_most_once IS DISTINCT FROM OLD.at_most_once
                       OR NEW.instance_level IS DISTINCT FROM OLD.instance_level)
    EXECUTE FUNCTION {schema}.refuse_kind_change();

CREATE TRIGGER keep_action_kind
    BEFORE UPDATE OF kind, at_most_once, instance_level ON {schema}.action_kind
    FOR EACH ROW WHEN (NEW.kind IS DISTINCT FROM OLD.kind
                       OR NEW.at_most_once IS DISTINCT FROM OLD.at_most_once
                       OR NEW.instance_level IS DISTINCT FROM OLD.instance_level)
    EXECUTE FUNCTION {schema}.refuse_kind_change();

CREATE TRIGGER keep_action_kind_rows
    BEFORE DELETE ON {schema}.action_kind
    FOR EACH ROW EXECUTE FUNCTION {schema}.refuse_kind_change();

CREATE TRIGGER keep_action_kind_table
    BEFORE TRUNCATE ON {schema}.action_kind
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse_kind_change();

-- 4. The lanes ------------------------------------------------------------------------------
-- One row per lane that has (or recently had) live actions: the claim walks this small table
-- instead of the actions, so a long lane, or many lanes whose heads wait out a backoff, cost
-- nothing per claim (docs/design/claim.md, "How" and "Who moves next_at").
--   next_at:   a lower bound of the time the lane next needs a look (its head falls due, a
--              lease runs out). Anyone may lower it; only a claim raises it, holding the lane's
--              row lock and reading the lane in a statement that began after the lock was taken.
--   head_id:   the lane's first live action when the last claim looked; enqueue keeps it at
--              or below the lowest live id, so the claim's search for the head starts there.
--   head_kind: that action's kind, so that an executor looks only at lanes whose head it
--              serves (a million lanes of a kind it lacks cost it nothing). NULL: not known
--              (the head just ended); every executor looks, and the first claim sets it.
CREATE TABLE {schema}.action_lane (
    lane_key   text PRIMARY KEY,
    next_at    timestamptz,
    head_id    bigint,
    head_kind  text
);

CREATE INDEX ix_action_lane_next
    ON {schema}.action_lane (head_kind, next_at) WHERE next_at IS NOT NULL;

-- One executing action per lane (migration 0020): a row per EXECUTING action of agent_action,
-- its lane's key unique. Its primary key is the specification's ux_agent_action_lane_executing,
-- what allows one executing action per lane also when two replicas claim at once, in every
-- isolation level (a unique index, checked as the row is inserted). It lives here and not as a
-- partial index of agent_action so that no index of agent_action names `state` (section 3).
-- hold_lanes, a statement trigger on agent_action, keeps it after every UPDATE statement (the
-- actions that left EXECUTING free their lanes, then those that entered it take theirs: a lane
-- another action holds refuses with the unique index's error); free_lane frees the lane of an
-- executing action deleted (an erasure); keep_lane_holders refuses any other write, which
-- could free a lane whose action still executes. The claim reads a lane's executing action
-- here.
CREATE TABLE {schema}.action_executing (
    lane_key   text CONSTRAINT ux_agent_action_lane_executing PRIMARY KEY,
    action_id  bigint NOT NULL
);

COMMENT ON TABLE {schema}.action_executing IS
    'One row per EXECUTING action of agent_action, its lane unique; written only by agent_action''s triggers';

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

-- 5. The lifecycle, enforced ---------------------------------------------------------------
-- The allowed pairs are the table TRANSITIONS in outbox_core/states.py;
-- tests/test_lifecycle_trigger.py checks every ordered pair of states against this trigger,
-- so a change to one without the other fails the suite. This function is the one statement of
-- the lifecycle; the update trigger below skips it for the updates it would let through.
CREATE FUNCTION {schema}.guard_agent_action() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action %: a new action is PROPOSED or ADMITTED, not %', NEW.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;

    -- An operator's resolution of an UNCERTAIN action (migration 0018): the only way an ended
    -- action changes. It needs an audit row of this transaction naming the action and this
    -- very change (outbox_core/operator.py writes it just before), so no executor path, which
    -- writes none, can take it.
    IF OLD.state = 'UNCERTAIN' AND NEW.state IN ('DONE', 'FAILED', 'ADMITTED')
       AND EXISTS (SELECT 1 FROM {schema}.action_audit au
                    WHERE au.action_id = OLD.id AND au.xact = pg_current_xact_id()
                      AND au.before_state = 'UNCERTAIN' AND au.after_state = NEW.state) THEN
        IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
           OR NEW.idempotency_key <> OLD.idempotency_key OR NEW.epoch <> OLD.epoch
           OR NEW.attempt <> OLD.attempt
           OR NEW.write_started_at IS DISTINCT FROM OLD.write_started_at THEN
            RAISE EXCEPTION 'agent_action %: a resolution changes the state only (id, kind, lane, key, epoch, attempt and the fence''s mark stay)', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.state = 'DONE' AND (NEW.stop_reason IS DISTINCT FROM 'RESOLVED_DONE'
                                   OR NEW.readback_ref IS NULL OR NEW.payload IS NOT NULL) THEN
            RAISE EXCEPTION 'agent_action %: resolved DONE needs stop_reason RESOLVED_DONE, the provider''s reference and no payload', OLD.id
                USING ERRCODE = 'check_violation';
        ELSIF NEW.state = 'FAILED' AND (NEW.stop_reason IS DISTINCT FROM 'RESOLVED_ABSENT'
                                        OR NEW.payload IS NOT NULL) THEN
            RAISE EXCEPTION 'agent_action %: resolved FAILED needs stop_reason RESOLVED_ABSENT and no payload', OLD.id
                USING ERRCODE = 'check_violation';
        ELSIF NEW.state = 'ADMITTED' THEN
            -- Read back again, as after a lost lease: only a kind that reads back, and only
            -- with its fence's mark, so that the next attempt looks for the earlier write
            -- before it writes. It is live again: its payload back, no ending.
            IF OLD.at_most_once OR OLD.write_started_at IS NULL THEN
                RAISE EXCEPTION 'agent_action %: only a read-back kind whose write started is read back again', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            IF NEW.payload IS NULL OR NEW.ended_at IS NOT NULL OR NEW.stop_reason IS NOT NULL THEN
                RAISE EXCEPTION 'agent_action %: an action read back again is live: its payload, no ended_at, no stop_reason', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END IF;
        NEW.ended_at := now();
        RETURN NEW;
    END IF;

    IF OLD.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes (an UNCERTAIN one only by an operator''s resolution, with its audit row)', OLD.id, OLD.state
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
    -- Every other update keeps the epoch, and so it is no claim: it never raises the
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
    -- The fence's mark stays while the action stays in its state: clearing it on an
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

-- The update trigger (migrations 0006 and 0011). Its WHEN clause holds only for updates that
-- the function would let through unchanged, so that the claim, the ending, the fence, the
-- reread and the retry of every action pass without a PL/pgSQL call (about 5 us an update):
-- the identity columns kept, and one of
--   * a claim of an admitted action (epoch and attempt up by one; an at-most-once action only
--     before its write started);
--   * at the same epoch, with the attempt kept or one given back (only a claim raises it):
--       - an ending of an executing action with a stop reason, no payload, ended_at set
--         (settle_v2 sets it) and the lease kept;
--       - an update of an executing action that keeps it EXECUTING (a fence, a reread, a
--         renewal) and the fence's mark once set, or returns it to ADMITTED with its lease
--         cleared or kept (a retry, a deferral, a give-back);
--       - an update of an admitted action that keeps it ADMITTED, its lease and the fence's
--         mark once set (a new due time).
-- Every column it reads is NOT NULL, or tested with IS; coalesce keeps a NULL from ever
-- skipping the function. Every other update runs the whole function.
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
              -- no claim: the attempt kept, or one given back
              AND NEW.attempt <= OLD.attempt AND NEW.attempt >= OLD.attempt - 1
              AND ((OLD.state = 'EXECUTING'
                    AND NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
                    AND NEW.stop_reason IS NOT NULL AND NEW.payload IS NULL
                    AND NEW.ended_at IS NOT NULL
                    AND NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until)
                -- a fence's mark, once set, kept while the state is
                OR (OLD.state = 'EXECUTING' AND NEW.state = 'EXECUTING'
                    AND (OLD.write_started_at IS NULL
                         OR NEW.write_started_at IS NOT DISTINCT FROM OLD.write_started_at))
                -- back to ADMITTED: the lease cleared or kept, never moved
                OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED'
                    AND (NEW.lease_until IS NULL
                         OR NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until))
                -- an admitted action keeps its lease (it has none) and its mark
                OR (OLD.state = 'ADMITTED' AND NEW.state = 'ADMITTED'
                    AND NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until
                    AND (OLD.write_started_at IS NULL
                         OR NEW.write_started_at IS NOT DISTINCT FROM OLD.write_started_at))))),
        false))
    EXECUTE FUNCTION {schema}.guard_agent_action();

-- Only an insert that is not PROPOSED or ADMITTED calls the function: the WHEN clause keeps
-- the common insert free of a PL/pgSQL call.
CREATE TRIGGER guard_agent_action_insert
    BEFORE INSERT ON {schema}.agent_action
    FOR EACH ROW WHEN (NEW.state NOT IN ('PROPOSED', 'ADMITTED'))
    EXECUTE FUNCTION {schema}.guard_agent_action();

-- Ended actions are deleted; an erasure deletes live ones too. Neither is refused.

-- 6. What this build decodes ----------------------------------------------------------------
-- Whether this build decodes an action: its kind is one the caller serves (p_kinds), its
-- payload matches that kind's SQL/JSON path (derived from the adapter's variants()) and the
-- last segment of its idempotency key matches the kind's suffix pattern, where the kind has
-- them (arrays aligned by position, one entry per kind as KindFilter builds them; NULL: not
-- checked; where a kind repeats, its first entry counts). The claim, the reclaim, the reaper,
-- expiry and the gauges look only at rows it accepts, so a replica of an older build never
-- touches a newer build's rows (docs/rolling-updates.md). One expression, so that the planner
-- inlines it instead of running a function for every row it looks at (migration 0004).
CREATE FUNCTION {schema}.decodable_v1(
    a_kind text, a_payload jsonb, a_key text,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT coalesce(
        a_kind = ANY (p_kinds)
        AND (p_paths[array_position(p_kinds, a_kind)] IS NULL
             OR coalesce(a_payload @@ p_paths[array_position(p_kinds, a_kind)], false))
        AND (p_suffixes[array_position(p_kinds, a_kind)] IS NULL
             OR a_key ~ p_suffixes[array_position(p_kinds, a_kind)]),
        false)
$fn$;

-- 7. The claim ------------------------------------------------------------------------------
-- docs/design/claim.md explains the claim: what must hold, how, and who moves next_at.
-- What the three claim functions return: the claimed action in the columns the executor
-- needs, and `op`, what claim_locked_v1 decided (below). claim_v1 adds one row 'visited'
-- whose id is the number of lanes it looked at.
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

-- The claim of the scheduled executor: lock up to p_limit lanes that need a look, skipping
-- lanes that another claim, an enqueue or an ending holds, and lanes whose known head this
-- build cannot decode; then, in a new statement, claim their heads. Two statements, not one:
-- one statement's snapshot could predate an ending that committed just before its lock, see
-- the old head still executing, and push the lane's next look out to a lease that is over.
-- Lanes are looked up by kind (and those whose head is not known), each an index range in
-- next_at order, so lanes headed by kinds this executor does not serve are never read. The
-- lanes taken are the p_limit earliest by next_at across every kind and the lanes of unknown
-- head (migration 0012; before, those came last), read without locks (a merge of the ranges,
-- at most p_limit entries each) and locked in the same statement where no one else holds
-- them; only the room that those locks left is filled kind by kind in random order (the
-- unknown lanes last) from the latest next_at read on. A due lane is thus never passed over
-- for lanes that fell due after it (docs/design/claim.md, "The bound").
CREATE FUNCTION {schema}.claim_v1(
    p_limit integer, p_lease interval,
    p_kinds text[], p_paths jsonpath[], p_suffixes text[]
) RETURNS SETOF {schema}.claimed_action_v1
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lanes text[];
    v_more text[];
    v_kind text;
    v_unknown boolean;
    v_cutoff timestamptz;
    v_seen integer;
    v_ranges text;
    -- A lane that needs a look and whose known head this build decodes. A scalar subquery,
    -- not NOT EXISTS: it stays one index probe per lane read, where an anti-join may be
    -- planned as a hash over every action (the planner cannot tell that few lanes are read).
    v_due constant text := $q$
        l.next_at <= now()
        AND coalesce((SELECT {schema}.decodable_v1(h.kind, h.payload, h.idempotency_key,
                                                   $2, $3, $4)
                        FROM {schema}.agent_action h
                       WHERE h.id = l.head_id AND h.state IN ('ADMITTED', 'EXECUTING')),
                     true)$q$;
BEGIN
    -- Dynamic SQL, planned for these kinds and this limit: a generic plan with a
    -- parameterised LIMIT may walk the whole index.
    SELECT string_agg(format(
        '(SELECT l.lane_key, l.next_at FROM {schema}.action_lane l WHERE l.head_kind %s AND %s '
        'ORDER BY l.next_at LIMIT %s)',
        CASE WHEN k.kind IS NULL THEN 'IS NULL' ELSE '= ' || quote_literal(k.kind) END,
        v_due, p_limit), ' UNION ALL ')
      INTO v_ranges
      FROM (SELECT kind FROM unnest(p_kinds) AS u(kind) UNION ALL SELECT NULL) k;
    -- The p_limit earliest lanes (read without locks), locked where no one else holds them;
    -- and the cutoff, the latest next_at among them.
    EXECUTE format($q$
        WITH c AS (
            SELECT r.lane_key, r.next_at FROM (%s) r ORDER BY r.next_at LIMIT %s
        )
        SELECT (SELECT max(c.next_at) FROM c), (SELECT count(*)::integer FROM c),
               (SELECT coalesce(array_agg(s.lane_key), '{}')
                  FROM (SELECT l.lane_key
                          FROM {schema}.action_lane l
                         WHERE l.lane_key IN (SELECT c.lane_key FROM c) AND l.next_at <= now()
                         ORDER BY l.next_at
                           FOR UPDATE OF l SKIP LOCKED) s)
        $q$, v_ranges, p_limit)
      INTO v_cutoff, v_seen, v_lanes
      USING NULL::text, p_kinds, p_paths, p_suffixes;
    IF v_cutoff IS NULL THEN
        RETURN;
    END IF;
    -- Only when the read saw p_limit lanes (there may be more) and locks held elsewhere left
    -- room: the lanes from the cutoff on, kind by kind, the unknown lanes last.
    IF cardinality(v_lanes) < p_limit AND v_seen = p_limit THEN
        FOR v_kind, v_unknown IN
            SELECT u.kind, u.unknown
              FROM (SELECT k.kind, false AS unknown, random() AS r
                      FROM unnest(p_kinds) AS k(kind)
                    UNION ALL SELECT NULL, true, 0) u
             ORDER BY u.unknown, u.r
        LOOP
            EXIT WHEN cardinality(v_lanes) >= p_limit;
            EXECUTE format($q$
                SELECT array_agg(s.lane_key)
                  FROM (SELECT l.lane_key
                          FROM {schema}.action_lane l
                         WHERE l.head_kind %s AND l.next_at >= $5 AND %s
                           AND l.lane_key <> ALL($6)
                         ORDER BY l.next_at
                         LIMIT %s
                           FOR UPDATE OF l SKIP LOCKED) s
                $q$, CASE WHEN v_unknown THEN 'IS NULL' ELSE '= $1' END, v_due,
                p_limit - cardinality(v_lanes))
              INTO v_more
              USING v_kind, p_kinds, p_paths, p_suffixes, v_cutoff, v_lanes;
            v_lanes := v_lanes || coalesce(v_more, '{}');
        END LOOP;
    END IF;
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

-- The second half of every claim (claim_v1, claim_action_v1, and settle_v1's chained claims):
-- the caller already holds the row locks of p_lanes, taken by an earlier statement, so this
-- statement's snapshot sees every action committed into those lanes (an enqueue in progress
-- holds the lane's lock until it commits, and waits for ours). For each lane it looks at one
-- action: the executing holder if there is one, else the first live action by id. That
-- action is
--   'empty'    no live action: the lane row is deleted;
--   'foreign'  this build cannot decode it: left untouched; the lane's next_at is lowered to
--              now, so that a replica that may run it looks at once (migration 0009);
--   'busy'     executing under a live lease: the lane is looked at again when the lease ends;
--   'claim'    admitted and due: claimed (epoch and attempt + 1, a lease on the database clock);
--   'reclaim'  executing under an expired lease: claimed again, without waiting on the lane;
--   'reap_lost'/'reap_exhausted'/'expire': returned for the caller to end in its own
--              transaction, where the kind's ended() runs; an admitted action whose write
--              started (a deferral after a Reread) never expires: it is claimed and reads back;
--   'wait'     admitted but not due: the lane is looked at again when it falls due;
--   'other'    (run_now only) not the named action: left untouched.
-- A later action of a lane is never looked at while an earlier one lives, which is the lane
-- order, and no statement here walks a lane's backlog. The executing holder is read from
-- action_executing (section 4), the first live action through ix_agent_action_lane_id from
-- head_id (migration 0020; they read partial indexes on `state` before).
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
        SELECT l.lane_key, coalesce(x.action_id, h.id) AS id, h.id AS first_id
          FROM lanes l
          -- The lane's executing action, if any: one probe (migration 0020).
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
                 -- A proposal is never claimed (run_now included), whatever its
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
                   -- The admission and the refusal lower the lane (the admit query,
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

-- 8. The settle -----------------------------------------------------------------------------
-- Attempts post their endings to a batcher that writes a batch in one call of settle_v3
-- (docs/design/claim.md, "Endings and fences"). What settle_v1, settle_v2 and settle_v3 return:
-- an action in the columns every reader selects (ACTION_COLUMNS in outbox_core/action.py;
-- settle_v1 without last_detail), and what happened to it:
--   'ended'    an ending of this batch applied (the row as it is now; settle_v3 without
--              p_full: its id and attempt only);
--   'claim', 'reclaim', 'reap_lost', 'reap_exhausted', 'expire'   as claim_locked_v1, for the
--              next head of a lane whose head this batch ended (due_at and the columns an
--              ended row has are NULL);
--   'lowered'  a lane whose head ended, lowered to now for a claim to look at (not chained);
--   'skipped'  a lane another transaction held: lower it again after commit, to due_at (NULL:
--              now), clearing its head kind when last_result is 'cleared'.
CREATE TYPE {schema}.settled_v1 AS (
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
    created_at          timestamptz
);

-- settled_v2: settled_v1 and the action's last_detail (migration 0013), NULL but for the
-- 'ended' rows.
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

-- settle_v3: apply a batch of endings, each with its detail (each only while its action is
-- still in the state and at the epoch its attempt saw), then for each lane involved:
--   * a lane whose head ended: lock it (SKIP LOCKED) and, when p_chain, claim its next head
--     in a new statement (claim_locked_v1), so the lane does not wait for a claim loop;
--   * any other lane (a retry, a deferral, a reread, or a lane another transaction held):
--     lower next_at to when it needs a look; a lane held by another transaction is returned
--     as 'skipped'.
-- One round trip for the whole batch. Each ended action comes back whole when p_full (a batch
-- with ended()/rescheduled() hooks, which need the row), else as its id and attempt only
-- (migration 0022). The caller runs the kinds' ended() hooks in the same transaction when it
-- has any (then it calls this inside an explicit transaction). The write fence is a statement of
-- its own (begin_write in sql/queries.sql), not a function.
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

-- settle_v2, for replicas of builds before migration 0022: settle_v3 with every ended action
-- whole.
CREATE FUNCTION {schema}.settle_v2(
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

-- settle_v1, for replicas of builds before migration 0013: settle_v2 without details (their
-- endings clear a detail that an earlier attempt left).
CREATE FUNCTION {schema}.settle_v1(
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

-- 9. What `outbox migrate` has applied ------------------------------------------------------
-- Not a migration's: `outbox migrate` creates it (migrations.py, _tracking_ddl) before it
-- applies the first file, and writes one row per applied file of every line (core and
-- plugins), with the file's checksum, so that a changed applied file is refused.
CREATE TABLE IF NOT EXISTS {schema}.schema_migration (
    line text NOT NULL,
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (line, version)
);

-- 10. Wake-ups ------------------------------------------------------------------------------
-- An enqueue notifies only when an executor waits for a wake-up (migration 0016, which says
-- why and how the race with a registering executor is closed; executor/waiting.py is the
-- executor's side). A row per executor that may wait, keyed by the server's pid of the
-- connection it LISTENs on; UNLOGGED: the rows describe the connections of now.
CREATE UNLOGGED TABLE {schema}.executor_waiting (
    listener_pid  integer PRIMARY KEY,
    since         timestamptz NOT NULL DEFAULT now()
);

-- Whether an enqueue should notify: VOLATILE, so its read takes a snapshot of its own, after
-- the enqueue's insert. A REPEATABLE READ or SERIALIZABLE caller, whose snapshot may predate
-- a registration, always notifies. SECURITY DEFINER: the application's role needs no grant
-- on the table; every name is qualified, so a caller's search_path decides none (a SET
-- search_path clause did that at 3-5 % of a single enqueue: migration 0017).
CREATE FUNCTION {schema}.wake_wanted_v1() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
BEGIN
    RETURN pg_catalog.current_setting('transaction_isolation')
               OPERATOR(pg_catalog.<>) 'read committed'
        OR EXISTS (SELECT 1 FROM {schema}.executor_waiting);
END
$fn$;

-- 11. The operator ------------------------------------------------------------------------
-- What an operator did to an action (migration 0018, outbox_core/operator.py): who, when on
-- the database clock, which command, why, from which surface, the state before and after.
-- Kept with the action and deleted with it (retention, erasure). `xact` is the transaction
-- that wrote the row: guard_agent_action (section 5) lets an UNCERTAIN action be resolved
-- only in a transaction that wrote the audit row of that very change.
CREATE TABLE {schema}.action_audit (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id          bigint NOT NULL REFERENCES {schema}.agent_action (id) ON DELETE CASCADE,
    at                 timestamptz NOT NULL DEFAULT now(),
    actor              text NOT NULL CHECK (actor <> ''),
    command            text NOT NULL CHECK (command <> ''),
    reason             text NOT NULL CHECK (btrim(reason) <> ''),
    surface            text NOT NULL CHECK (surface IN ('cli', 'dashboard', 'api')),
    before_state       text,
    after_state        text NOT NULL,
    -- The other action of a retry: the new one on the old one's row, the old one on the new's.
    related_action_id  bigint,
    readback_ref       text,
    xact               xid8 NOT NULL DEFAULT pg_current_xact_id()
);

CREATE INDEX ix_action_audit_action ON {schema}.action_audit (action_id);

-- The payload of an action that ended UNCERTAIN, FAILED or CANCELLED, beside the action (the
-- ended row keeps none): what `outbox retry` and `outbox resolve --retry` run again. Copied by
-- a trigger as the action ends, whatever ends it; gone with the action.
CREATE TABLE {schema}.action_kept_payload (
    action_id  bigint PRIMARY KEY REFERENCES {schema}.agent_action (id) ON DELETE CASCADE,
    payload    jsonb NOT NULL
);

CREATE FUNCTION {schema}.keep_action_payload() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO {schema}.action_kept_payload (action_id, payload)
    VALUES (NEW.id, OLD.payload)
    ON CONFLICT (action_id) DO UPDATE SET payload = excluded.payload;
    RETURN NULL;
END
$fn$;

-- Only the endings an operator may act on, and only when there was a payload to keep: every
-- other update (a claim, a fence, a DONE) passes the WHEN clause without a PL/pgSQL call.
CREATE TRIGGER keep_action_payload
    AFTER UPDATE ON {schema}.agent_action
    FOR EACH ROW
    WHEN (OLD.payload IS NOT NULL AND NEW.state IN ('UNCERTAIN', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION {schema}.keep_action_payload();

-- 12. The failed and uncertain actions -------------------------------------------------------
-- One row per action that ended FAILED or UNCERTAIN (migration 0020): the uncertain gauge,
-- `outbox status` and the dashboard read these, where they read partial indexes of
-- agent_action on `state` and `ended_at` before (section 3 says why those are gone). A row
-- trigger whose WHEN clause holds only when an action enters or leaves one of those states, or
-- is deleted in one, keeps it: a claim or a DONE costs nothing.
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

-- A TRUNCATE of agent_action (which must CASCADE to action_audit and action_kept_payload)
-- empties action_executing and action_failure too: they hold no rows of actions that are gone.
CREATE FUNCTION {schema}.free_all_lanes() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.action_executing;
    DELETE FROM {schema}.action_failure;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER free_all_lanes
    AFTER TRUNCATE ON {schema}.agent_action
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.free_all_lanes();
