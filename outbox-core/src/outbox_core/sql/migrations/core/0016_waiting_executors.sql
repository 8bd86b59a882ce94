-- The core line, version 16: an enqueue wakes executors only when one is waiting.
--
-- Every enqueue notified the schema's channel, and PostgreSQL serialises the commits of the
-- transactions that notified (PreCommit_Notify takes a lock held until after the commit's WAL
-- flush), so that concurrent producers lost their group commit: at 64 producers, a raw INSERT
-- that notified ran at 0.55x the same INSERT without (docs/benchmarks.md, issue 23). A busy
-- executor needs no notification: its next claim round finds the action. Only an executor
-- whose claim loop waits (for a notification or its poll) does.
--
-- executor_waiting holds a row for each executor that may wait: the server's pid of the
-- connection it LISTENs on. An executor writes its row before it waits (again at each poll),
-- and removes it once it has been busy for a while (outbox_core/executor/waiting.py).
-- wake_wanted_v1() tells an enqueue whether to notify: whether a row exists, read with a
-- snapshot of its own, taken after the enqueue's insert (the function is VOLATILE: each of its
-- statements takes a new snapshot under READ COMMITTED). The race that leaves, an enqueue whose
-- check came before a registration committed, the executor closes: its transaction had its id
-- by then, so once the row is committed the executor draws an id of its own and watches the
-- transactions below it that still run (its snapshot's list and those at or above the
-- snapshot's xmax, which a snapshot does not list), claiming at once and again whenever fewer of
-- them run. A REPEATABLE READ or SERIALIZABLE caller reads with its transaction's snapshot,
-- which may predate a registration: it always notifies.
--
-- SECURITY DEFINER: an application's role that may enqueue (docs/operations.md, "The database
-- role") calls it without a grant on the table, which it never reads otherwise; it says only
-- whether a row exists.
--
-- UNLOGGED: the rows describe the executors connected now; a crash that empties the table
-- also ends their connections. A row whose listener is gone (an executor killed) costs
-- notifications nobody reads until an executor's maintenance removes it.
--
-- A replica of an older build still notifies at every enqueue (which wakes the executors of
-- both builds), and does not register when it waits: an enqueue of this build wakes it only
-- while an executor of this build waits too; otherwise it finds the action at its poll
-- (OUTBOX_POLL_SECONDS), until it is replaced (docs/rolling-updates.md).
CREATE UNLOGGED TABLE {schema}.executor_waiting (
    listener_pid  integer PRIMARY KEY,
    since         timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION {schema}.wake_wanted_v1() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM {schema}.executor_waiting);
END
$fn$;
