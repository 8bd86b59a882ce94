-- The core line, version 4: decodable_v1 written as one expression, so that the planner
-- inlines it into the claim, the settle and the gauges instead of running a SQL function (a
-- subquery over unnest) for every row it looks at. Same arguments, and the same answer for
-- the arrays every build passes (one entry per kind, numbered from 1, as KindFilter builds
-- them): the kind is one the caller serves, its payload matches that kind's path and its key
-- that kind's suffix pattern, where the kind has them (arrays aligned by position; NULL: not
-- checked). Where a kind repeats, only its first entry counts now (before: any entry). A
-- replica of an older build calls the same function and gets the same answers, faster.
CREATE OR REPLACE FUNCTION {schema}.decodable_v1(
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
