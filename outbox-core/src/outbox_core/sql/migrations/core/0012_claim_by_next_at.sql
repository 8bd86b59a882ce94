-- The core line, version 12: claim_v1 restated (from 0002) with the same contract (a replica of
-- an older build calls the same function, with the same arguments and rows), for one
-- correction: a due lane is no longer passed over for lanes that fell due after it.
--   * claim_v1 filled its limit kind by kind and took the lanes whose head kind is not known
--     (head_kind IS NULL) last, and only when the known kinds left room. A lane whose head
--     ended while a producer's enqueue held its row is skipped by the settle's chained claim
--     and lowered again after the enqueue commits, with its head kind cleared; under a backlog
--     of due lanes of known kinds such a lane waited until the backlog ran dry (151 s in a
--     chaos run, issue 22). Now the claim reads, without locks, the p_limit earliest due
--     lanes across every kind it serves and the unknown lanes (a merge of the kinds' index
--     ranges, at most p_limit entries each) and locks them in the same statement where no one
--     else holds them; only the room that those locks left is filled kind by kind from the
--     latest next_at read on, as before. The bound this gives is in docs/design/claim.md
--     ("The bound"). Each lane read is checked for decodability by one index probe (a scalar
--     subquery; an anti-join was planned as a hash over every action).
-- The executor reads the same rows; a replica of the previous build runs this version as soon
-- as it is applied (docs/rolling-updates.md), and a replica of this build against a database
-- at version 11 runs the old one: both orders are correct, the old one only slower to reach a
-- lane of unknown head.

CREATE OR REPLACE FUNCTION {schema}.claim_v1(
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
