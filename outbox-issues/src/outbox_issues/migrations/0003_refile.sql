-- A filing STOPPED because GitHub refused its content (stop reason CONTENT_REFUSED: a 422 on
-- the title or the body, so nothing was filed) is filed again by an edit: STOPPED -> NEW, the
-- same row as outbox_issues.domain.TRANSITIONS (tests/test_filing_trigger.py checks both).
-- Additive: an older build never asks for it.
INSERT INTO {schema}.issue_filing_transition (from_state, to_state) VALUES ('STOPPED', 'NEW')
ON CONFLICT DO NOTHING;
