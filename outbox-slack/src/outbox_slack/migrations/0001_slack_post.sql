-- The SLACK_POST kind and the domain it posts from.
-- SLACK_POST reads back (a post carries its idempotency key in Slack message metadata, so an
-- attempt after an unknown write finds it in the history): not at most once. A post belongs to a
-- workspace: not instance-level. It opts out of the 30-day retention in code
-- (SlackPostAdapter.retained = False): its ended rows are removed when their entries are
-- redacted (outbox_slack.redact), not by the sweep.
-- Additive only: an older replica that runs `outbox migrate` never removes it.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('SLACK_POST', false, false, 'slack')
ON CONFLICT (kind) DO NOTHING;

-- One row per posted turn. It outlives its action: a turn whose action was removed after its
-- entries were redacted is still known, so posting it again is refused.
CREATE TABLE {schema}.slack_turn (
    turn_id             text PRIMARY KEY CHECK (turn_id <> ''),
    workspace_id        text NOT NULL,
    channel             text NOT NULL CHECK (channel <> ''),
    thread_ts           text,
    subject_account_id  text,
    idempotency_key     text NOT NULL UNIQUE,
    -- No foreign key: the action is removed (redaction, erasure) while the turn stays.
    action_id           bigint,
    -- The read-back's progress across Rereads (a history read may take several attempts when
    -- Slack allows one request a minute): the page to read next and when this read began.
    readback_cursor     text,
    readback_started_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX ix_slack_turn_action ON {schema}.slack_turn (action_id);
CREATE INDEX ix_slack_turn_subject
    ON {schema}.slack_turn (subject_account_id) WHERE subject_account_id IS NOT NULL;

-- The admitted entries of a turn (a question or a digest). text is NULL once redacted.
-- message_channel/message_ts: the post's Slack reference, what a later reply needs to open a
-- thread. outcome/stop_reason: the delivery's end, recorded only when the action is removed
-- (while the action exists, delivery state has one home: the outbox).
CREATE TABLE {schema}.slack_entry (
    entry_id         text PRIMARY KEY CHECK (entry_id <> ''),
    turn_id          text NOT NULL REFERENCES {schema}.slack_turn (turn_id) ON DELETE CASCADE,
    entry_kind       text NOT NULL CHECK (entry_kind IN ('question', 'digest')),
    position         integer NOT NULL,
    channel          text NOT NULL,
    text             text,
    redacted_at      timestamptz,
    message_channel  text,
    message_ts       text,
    outcome          text,
    stop_reason      text,
    CONSTRAINT ck_slack_entry_redacted CHECK ((text IS NULL) = (redacted_at IS NOT NULL)),
    UNIQUE (turn_id, position)
);
