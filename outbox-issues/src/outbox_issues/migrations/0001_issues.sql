-- The four kinds of outbox-issues: all read back (every write carries a marker that a later
-- attempt finds by listing), none instance-level (a report belongs to a workspace).
-- Additive only: an older replica that runs `outbox migrate` never removes them.
INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line)
VALUES ('FILE_ISSUE', false, false, 'issues'),
       ('PUBLISH_REPORT', false, false, 'issues'),
       ('CLEANUP_ISSUE', false, false, 'issues'),
       ('TRANSFER_ISSUE', false, false, 'issues')
ON CONFLICT (kind) DO NOTHING;

-- A person's feedback on the product: person data, all of it. An erasure of the reporter
-- deletes the row; the filing (which holds no person data) stays to scrub the issue.
CREATE TABLE {schema}.issue_report (
    report_id            text PRIMARY KEY,
    workspace_id         text NOT NULL,
    reporter_account_id  text NOT NULL,
    title                text NOT NULL,
    text                 text NOT NULL,
    generation           integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_issue_report_reporter ON {schema}.issue_report (reporter_account_id);

-- The filing's allowed transitions between two different states: the same rows as
-- outbox_issues.domain.TRANSITIONS (tests/test_filing_trigger.py checks both against the
-- live trigger). An update that keeps the state is always allowed.
CREATE TABLE {schema}.issue_filing_transition (
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO {schema}.issue_filing_transition (from_state, to_state) VALUES
    ('NEW', 'DRAFT_CLAIMED'), ('NEW', 'ANSWERED'), ('NEW', 'FILING'), ('NEW', 'STOPPED'),
    ('DRAFT_CLAIMED', 'DRAFT_WAITING'), ('DRAFT_CLAIMED', 'ANSWERED'),
    ('DRAFT_CLAIMED', 'STOPPED'),
    ('DRAFT_WAITING', 'DRAFT_CLAIMED'), ('DRAFT_WAITING', 'ANSWERED'),
    ('DRAFT_WAITING', 'STOPPED'),
    ('ANSWERED', 'FILING'), ('ANSWERED', 'FILED'), ('ANSWERED', 'STOPPED'),
    ('FILING', 'FILED'), ('FILING', 'STOPPED'),
    ('FILED', 'DRAFT_CLAIMED'), ('FILED', 'DRAFT_WAITING'), ('FILED', 'ANSWERED');

-- The report's delivery to the tracker, in generations (a re-draft or an edit starts one).
-- No foreign key to the report: the filing outlives an erasure of it.
CREATE TABLE {schema}.issue_filing (
    report_id             text PRIMARY KEY,
    workspace_id          text NOT NULL,
    state                 text NOT NULL DEFAULT 'NEW' CONSTRAINT ck_issue_filing_state CHECK (
        state IN ('NEW', 'DRAFT_CLAIMED', 'DRAFT_WAITING', 'ANSWERED', 'FILING', 'FILED',
                  'STOPPED')),
    generation            integer NOT NULL DEFAULT 1,
    -- The draft's answer (outbox-draft keeps it here under its attempt's lease).
    draft_generation      integer,
    draft_title           text,
    draft_body            text,
    -- Where the issue is: set when FILE_ISSUE starts writing, and by a transfer.
    repository            text,
    issue_number          integer,
    issue_url             text,
    issue_node_id         text,
    filed_generation      integer,
    published_generation  integer,
    last_write_at         timestamptz,
    private               boolean NOT NULL DEFAULT false,
    stop_reason           text,
    stopped_by            text,
    last_error            text,
    erased_at             timestamptz,
    scrubbed_at           timestamptz,
    issue_deleted         boolean NOT NULL DEFAULT false,
    -- GitHub keeps an edited issue's earlier bodies, readable by anyone who can read the
    -- issue, and has no API to remove one: true once a scrub left the text there.
    history_retains_text  boolean NOT NULL DEFAULT false,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION {schema}.guard_issue_filing() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'NEW' THEN
            RAISE EXCEPTION 'issue_filing %: a new filing is NEW, not %', NEW.report_id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state AND NOT EXISTS (
        SELECT 1 FROM {schema}.issue_filing_transition t
         WHERE t.from_state = OLD.state AND t.to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'issue_filing %: % -> % is not an allowed transition',
            OLD.report_id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER guard_issue_filing BEFORE INSERT OR UPDATE ON {schema}.issue_filing
    FOR EACH ROW EXECUTE FUNCTION {schema}.guard_issue_filing();
