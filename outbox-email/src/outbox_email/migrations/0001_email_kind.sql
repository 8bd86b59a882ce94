-- The EMAIL kind: at most once (SMTP cannot be read back, so an action whose write started is
-- never claimed again) and instance-level (an email to an account has no workspace).
-- Additive only: an older replica that runs `outbox migrate` never removes it.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('EMAIL', true, true, 'email')
ON CONFLICT (kind) DO NOTHING;
