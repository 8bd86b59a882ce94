-- outbox: no transaction
-- The core line, version 10: the index that finds a lane's head, now over every live state.
--
-- A lane's head is its first live action in id order, and PROPOSED is live: a proposal holds
-- its lane until it is admitted or refused (migration 11 makes the claim look for it). The
-- head search, the blocked-lanes count and the lane reads name PROPOSED, ADMITTED and
-- EXECUTING; this index holds exactly those rows, so each stays one index descent.
--
-- It replaces ix_agent_action_lane_live (ADMITTED and EXECUTING), which is dropped once this
-- one is built: keeping both would write a second index entry at every enqueue, claim, retry
-- and deferral. A replica of an older build still asks for "state IN ('ADMITTED',
-- 'EXECUTING')"; PostgreSQL proves that this index's predicate covers it and uses this index,
-- stepping over a lane's proposals, which are few.
--
-- Built and dropped CONCURRENTLY, outside a transaction (the first line), so that enqueues,
-- claims and endings go on meanwhile. A build that failed leaves an invalid index behind and
-- no tracking row; the next `outbox migrate` drops it and builds it again.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_lane_head;

CREATE INDEX CONCURRENTLY ix_agent_action_lane_head
    ON {schema}.agent_action (lane_key, id) WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING');

DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_lane_live;
