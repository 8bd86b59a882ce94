-- The core line, version 17: wake_wanted_v1 restated (from 0016) with the same contract (every
-- replica's enqueue calls the same function), without its SET clause.
--
-- A function with a SET clause sets the parameter on entry and restores it on exit, and a
-- changed search_path makes the next lookup of a name rebuild the path: in an enqueue of one
-- action, one transaction each, that cost 40-60 us of a round of 1.0-1.3 ms, 3-5 % of the
-- single enqueue's rate (docs/benchmarks.md, issue 23). The clause was there because the
-- function is SECURITY DEFINER: a caller's search_path must not decide what its names mean.
-- Every name in it is now qualified instead (the function, the operator, the table), which
-- PostgreSQL's documentation gives as the other safe way: a caller's schema cannot put its own
-- <> or current_setting in front of pg_catalog's, and the table is named by its schema. The
-- rest is as before: VOLATILE, so that its read takes a snapshot of its own after the
-- enqueue's insert (0016 says why); SECURITY DEFINER, so that the application's role needs no
-- grant on executor_waiting.
CREATE OR REPLACE FUNCTION {schema}.wake_wanted_v1() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
BEGIN
    RETURN pg_catalog.current_setting('transaction_isolation')
               OPERATOR(pg_catalog.<>) 'read committed'
        OR EXISTS (SELECT 1 FROM {schema}.executor_waiting);
END
$fn$;
