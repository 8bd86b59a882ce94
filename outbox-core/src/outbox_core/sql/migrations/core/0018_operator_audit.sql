-- The core line, version 18: the operator's resolutions and retries (issue 32).
--   * action_audit: one row per operator's change of an action (who, when on the database
--     clock, which command, why, from which surface, the state before and after), kept with
--     the action and deleted with it (ON DELETE CASCADE: retention and erasure delete the
--     action, and with it its audit). `xact` is the writing transaction, which the trigger
--     below reads to tell an operator's resolution from anything else.
--   * action_kept_payload: the payload of an action that ended UNCERTAIN, FAILED or CANCELLED,
--     kept beside the action (the ended row itself keeps none, as before) so that an operator
--     can run it again (`outbox retry`) or read it back again (`outbox resolve --retry`); an
--     AFTER trigger copies it as the action ends, whichever path ends it (settle, cancel,
--     expiry, reaper), so no statement of the executor changes. A DONE action keeps nothing.
--     Deleted with the action (ON DELETE CASCADE): after retention or an erasure the payload
--     is gone, and so is the action.
--   * guard_agent_action gains the resolutions of an UNCERTAIN action (the table RESOLUTIONS
--     in outbox_core/states.py): DONE with RESOLVED_DONE and the provider's reference, FAILED
--     with RESOLVED_ABSENT, and ADMITTED again (its payload back, no ending) for a read-back
--     kind whose write started. Each only with an audit row of the same transaction that
--     names it; the rest of the function is as 0011 left it. Its trigger's WHEN clause is
--     unchanged: an update of an UNCERTAIN row never took the fast path.

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

-- The lifecycle, enforced (see 0001_schema.sql and 0011): as there, but for the resolution
-- block (new) and the ended row's message.
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
