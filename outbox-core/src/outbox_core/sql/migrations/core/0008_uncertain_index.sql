-- outbox: no transaction
-- The core line, version 8: the uncertain gauge without a pass over the table.
--
-- Every executor counts the UNCERTAIN actions by kind on each maintenance tick (every 10 s),
-- and `outbox status` does too. No index held the ended states, so that count read the whole
-- table, the ended actions of the last 30 days included: 67 ms with a million rows, on
-- every replica, every tick, and ten times that with ten times the rows. This partial index
-- holds only the UNCERTAIN actions (rare, and each waits for a person), so the count reads
-- those and nothing else (0.05 ms with a million rows); only an ending in UNCERTAIN adds an
-- entry, so the claim and the other endings cost nothing more.
--
-- Built CONCURRENTLY, outside a transaction (the first line), so that enqueues, claims and
-- endings go on while it is built. A build that failed leaves an invalid index behind and no
-- tracking row; the next `outbox migrate` drops it and builds it again.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_agent_action_uncertain;

CREATE INDEX CONCURRENTLY ix_agent_action_uncertain
    ON {schema}.agent_action (kind) WHERE state = 'UNCERTAIN';
