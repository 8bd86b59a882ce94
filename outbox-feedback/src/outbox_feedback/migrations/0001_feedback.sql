-- The three kinds of outbox-feedback: all read back (every copy carries its marker, which a
-- later attempt finds by listing the pull request's comments), none instance-level (a
-- feedback belongs to a workspace). Additive only: an older replica that runs
-- `outbox migrate` never removes them.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('DELIVER_FEEDBACK', false, false, 'feedback'),
       ('EDIT_FEEDBACK', false, false, 'feedback'),
       ('RETRACT_FEEDBACK', false, false, 'feedback')
ON CONFLICT (kind) DO NOTHING;

-- Feedback on one pull request: the decided content (a summary and inline items) and the
-- marks on it. `revision` rises with every decision or mark that commits; a send carries the
-- revision it read (`sending_revision`), and the send's ended hook compares the two under this
-- row's lock to decide whether a correction is owed. The author of the reviewed work is
-- person data: an erasure of that account deletes the feedback, its items and its copies.
CREATE TABLE {schema}.feedback (
    feedback_id         text PRIMARY KEY,
    workspace_id        text NOT NULL,
    author_account_id   text NOT NULL,
    repository          text NOT NULL,
    pull_number         integer NOT NULL CHECK (pull_number >= 1),
    summary             text NOT NULL,
    revision            integer NOT NULL DEFAULT 1 CHECK (revision >= 1),
    retracted_at        timestamptz,
    -- How many sends were queued: the <n> of the next send's key feedback:<id>:<n>:<variant>.
    sends               integer NOT NULL DEFAULT 0,
    -- The send whose attempt last read the feedback to write it, and the revision it read.
    sending_action      bigint,
    sending_revision    integer,
    -- The revision the last send that ended DONE delivered.
    delivered_revision  integer,
    last_send_key       text,
    last_send_state     text,
    last_stop_reason    text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_feedback_author ON {schema}.feedback (author_account_id);

-- The decided inline items, each on one line of the diff as GitHub takes it now: the commit,
-- the file, the line and the side (the deprecated diff `position` is never used).
CREATE TABLE {schema}.feedback_item (
    feedback_id  text NOT NULL REFERENCES {schema}.feedback ON DELETE CASCADE,
    item_id      text NOT NULL CHECK (item_id <> 'summary'),
    ordinal      integer NOT NULL,
    path         text NOT NULL,
    commit_id    text NOT NULL,
    line         integer NOT NULL CHECK (line >= 1),
    side         text NOT NULL CHECK (side IN ('LEFT', 'RIGHT')),
    body         text NOT NULL,
    resolved     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (feedback_id, item_id)
);

-- One row per copy on the tracker: the summary comment (item 'summary') and one review
-- comment per inline item. Each copy keeps its own write fence: `state` says what is known.
--   absent   not on the tracker (never written, deleted, or proved absent by a listing)
--   writing  a write of the running send (write_action) may have reached it: read it back
--            by its marker before anything else is written
--   unknown  as writing, but that send ended without settling it (expired, reaped, uncertain)
--   present  on the tracker as provider_id, holding confirmed_digest at confirmed_position
CREATE TABLE {schema}.feedback_copy (
    feedback_id         text NOT NULL REFERENCES {schema}.feedback ON DELETE CASCADE,
    item_id             text NOT NULL,
    surface             text NOT NULL CHECK (surface IN ('comment', 'review_comment')),
    marker              text NOT NULL,
    state               text NOT NULL DEFAULT 'absent'
                        CHECK (state IN ('absent', 'writing', 'unknown', 'present')),
    provider_id         bigint,
    url                 text,
    confirmed_digest    text,
    confirmed_position  text,
    confirmed_at        timestamptz,
    write_op            text CHECK (write_op IN ('create', 'update', 'delete')),
    write_digest        text,
    write_action        bigint,
    write_started_at    timestamptz,
    PRIMARY KEY (feedback_id, item_id)
);
