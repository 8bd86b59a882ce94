-- The chaos suite's two kinds, in the kind registry (the core line's table): one that reads its
-- write back, one at most once.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('CHAOS_READBACK', false, true, 'chaos'), ('CHAOS_ONCE', true, true, 'chaos')
ON CONFLICT (kind) DO NOTHING;
