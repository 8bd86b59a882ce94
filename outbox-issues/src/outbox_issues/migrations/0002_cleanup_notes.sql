-- What an erasure's cleanup could not do, kept on the filing for an operator (issue 31).
-- Additive: an older build neither reads nor writes these columns.
ALTER TABLE {schema}.issue_filing
    -- Why the tracker refused to delete the issue (OUTBOX_ISSUES_DELETE_ON_ERASURE): the
    -- cleanup scrubbed it instead. NULL: no delete was refused.
    ADD COLUMN delete_refused text,
    -- What of the erased reporter's is still published on the tracker, and where (the issue's
    -- URL, or its repository and marker), in words an operator can act on; set by the erasure,
    -- narrowed by the cleanup (NULL once nothing is left, or nothing was ever written).
    ADD COLUMN still_published text;
