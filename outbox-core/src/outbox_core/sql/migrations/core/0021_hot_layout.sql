-- outbox: no transaction
-- The core line, version 21: no index of agent_action names a column that a claim or an
-- ending changes, so both are HOT updates (issue 34; version 20 moved the rules those indexes
-- kept to action_executing and action_failure).
--
-- Dropped: the partial unique index of executing lanes (version 20 renamed it; the unique
-- index of action_executing holds the rule), the index of live actions by lane (the head
-- search walks ix_agent_action_lane_id from the lane row's head_id), the index of ended actions
-- (retention walks ix_agent_action_kind_id, kind by kind, oldest first; the status and the
-- dashboard read action_failure), the index of UNCERTAIN actions (action_failure) and the
-- expiry index, whose predicate named `state`: it is built again over every action with an
-- expiry (the sweep reads the expiries that came due since its last pass: outbox_core/
-- executor/maintenance.py).
--
-- fillfactor 50 (was 70): room on each page for a claim's and an ending's new row versions
-- next to the row, until pruning frees the dead ones. It applies to pages filled from now on;
-- the rows already written keep their pages.
--
-- A replica of an older build survives this file (tests/test_rolling_hot_layout.py runs one
-- beside this build): its claims and settles call the shared functions, which version 20
-- corrected; what its own statements read through the dropped indexes (its begin_write, its
-- gauges, retention and expiry) finds the same rows by other paths, at the costs
-- docs/rolling-updates.md gives.
--
-- Built and dropped CONCURRENTLY, outside a transaction, so enqueues, claims and endings go
-- on meanwhile; each DROP ... IF EXISTS lets the file run again from the top after a failure.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_expires_at;

CREATE INDEX CONCURRENTLY ix_agent_action_expires_at
    ON {schema}.agent_action (expires_at) WHERE expires_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ux_agent_action_lane_executing_old;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_lane_head;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_ended;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_expiry;

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_uncertain;

ALTER TABLE {schema}.agent_action SET (fillfactor = 50);
