-- outbox: no transaction
-- The core line, version 19: the indexes that keep `outbox actions` (outbox_core/search.py)
-- bounded on a table of ten million rows.
--
-- A search walks one index in id order, newest first, from its cursor: the filter's most
-- selective indexed field drives it (key, lane, subject, key prefix, workspace, kind, in that
-- order) and every other field filters the rows that walk reaches, at most a candidate window
-- of them per page. Before this migration only a lane's live actions and an account's actions
-- had an index, and neither in id order, so a search by lane, kind or workspace read every
-- matching row (or the whole table) to sort them.
--
-- (subject_account_id, id) replaces the index on subject_account_id alone: it serves erasure's
-- equality as well, and one index on the column costs each enqueue less than two.
--
-- idempotency_key COLLATE "C": a prefix is a range of the C collation's order, whatever the
-- database's collation; the unique index (default collation) serves the exact key.
--
-- Built CONCURRENTLY, outside a transaction, so that enqueues, claims and endings go on while
-- they are built; each DROP ... IF EXISTS first removes an invalid index that a failed build
-- left behind, so the file can run again from the top.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_kind_id;

CREATE INDEX CONCURRENTLY ix_agent_action_kind_id ON {schema}.agent_action (kind, id);

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_lane_id;

CREATE INDEX CONCURRENTLY ix_agent_action_lane_id ON {schema}.agent_action (lane_key, id);

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_workspace_id;

CREATE INDEX CONCURRENTLY ix_agent_action_workspace_id
    ON {schema}.agent_action (workspace_id, id) WHERE workspace_id IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_subject_id;

CREATE INDEX CONCURRENTLY ix_agent_action_subject_id
    ON {schema}.agent_action (subject_account_id, id) WHERE subject_account_id IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_subject;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_key_c;

CREATE INDEX CONCURRENTLY ix_agent_action_key_c
    ON {schema}.agent_action (idempotency_key COLLATE "C");
