-- A plugin line for the migration tests: it needs the core line's kind registry.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('FIXTURE_KIND', false, true, 'fixture') ON CONFLICT (kind) DO NOTHING;
CREATE TABLE {schema}.fixture_table (id bigint PRIMARY KEY);
