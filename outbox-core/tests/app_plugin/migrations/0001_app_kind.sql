-- The application's kind, in the kind registry (the core line's table).
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('TEST_APP_KIND', false, true, 'test_app') ON CONFLICT (kind) DO NOTHING;
