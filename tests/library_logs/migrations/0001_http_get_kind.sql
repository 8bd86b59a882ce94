-- The application's kind, in the kind registry (the core line's table).
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('TEST_HTTP_GET', false, true, 'test_library_logs') ON CONFLICT (kind) DO NOTHING;
