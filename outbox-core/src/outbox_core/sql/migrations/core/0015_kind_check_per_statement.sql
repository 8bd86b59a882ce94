-- The core line, version 15: the registry check of a new action's kind runs once per
-- statement, not once per row.
--
-- Until now a foreign key proved that each action's (kind, at_most_once, instance_level) is a
-- registered kind's. PostgreSQL checks a foreign key row by row: for every inserted row it
-- queues a trigger event, runs a lookup in the registry and locks the kind's row FOR KEY
-- SHARE. In a bulk enqueue of 10,000 actions that was a third of the statement's time
-- (docs/benchmarks.md, issue 23), and every concurrent producer's transaction locked the same
-- registry row, which PostgreSQL records in a MultiXact shared by all of them: at 64
-- producers, inserts into a copy of the table with the foreign key ran at 0.78x the same
-- table checked once per statement.
--
-- Now an AFTER INSERT statement trigger looks up the distinct kinds of the statement's rows
-- (its transition table) in the registry, once, and refuses the statement with the foreign
-- key's error (SQLSTATE 23503, the constraint's name) when one is not registered with those
-- flags. It covers every writer, as the foreign key did: enqueue, an older build's enqueue,
-- raw SQL, COPY. What the foreign key also did, two small triggers keep:
--   * an action's kind and its flags never change (the guard already refused a new kind;
--     now its flags too, checked only by an UPDATE that names those columns);
--   * the registry only grows: a kind is never deleted, nor its flags changed, nor the table
--     truncated (the foreign key refused that only for kinds with actions; kinds are only
--     ever added, DESIGN.md).
-- A replica of an older build inserts, claims and settles as before: none of its statements
-- names the constraint, and none changes a kind.

-- The action table's lock first, as 0011 explains: an enqueue holds it, then lane rows.
LOCK TABLE {schema}.agent_action IN ACCESS EXCLUSIVE MODE;

ALTER TABLE {schema}.agent_action DROP CONSTRAINT fk_agent_action_kind;

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
