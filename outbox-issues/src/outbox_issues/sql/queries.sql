-- The statements of outbox-issues. {schema} is the outbox schema; parameters are named.

-- name: insert_report
-- A report and its filing, once: a second submit of the same report (two requests racing)
-- waits on the first's insert and then inserts nothing.
INSERT INTO {schema}.issue_report (report_id, workspace_id, reporter_account_id, title, text)
VALUES (%(report)s, %(workspace)s, %(reporter)s, %(title)s, %(text)s)
ON CONFLICT (report_id) DO NOTHING
RETURNING report_id

-- name: insert_filing
INSERT INTO {schema}.issue_filing (report_id, workspace_id)
VALUES (%(report)s, %(workspace)s)
ON CONFLICT (report_id) DO NOTHING

-- name: lock_filing
-- The report's filing under its row lock: enqueues into the report's lane take it first, so
-- their order in the lane is the order the application asked for them.
SELECT f.state, f.generation, f.workspace_id, f.issue_number, f.private, f.erased_at,
       f.last_write_at, r.report_id IS NOT NULL, f.repository, f.issue_url, f.stop_reason
  FROM {schema}.issue_filing f
  LEFT JOIN {schema}.issue_report r ON r.report_id = f.report_id
 WHERE f.report_id = %(report)s
   FOR UPDATE OF f

-- name: new_generation
UPDATE {schema}.issue_report
   SET title = coalesce(%(title)s, title), text = coalesce(%(text)s, text),
       generation = generation + 1, updated_at = now()
 WHERE report_id = %(report)s
RETURNING generation

-- name: filing_generation
UPDATE {schema}.issue_filing SET generation = %(generation)s WHERE report_id = %(report)s

-- name: read_for_write
-- What an attempt writes: the filing (locked, so an erasure waits for the attempt's decision
-- and then sees it) and the report, which an erasure may have deleted.
SELECT f.state, f.generation, f.workspace_id, f.repository, f.issue_number, f.issue_url,
       f.issue_node_id, f.last_write_at, f.draft_generation, f.draft_title, f.draft_body,
       f.private, f.erased_at, f.created_at,
       r.report_id IS NOT NULL, r.title, r.text, r.generation, now(), f.delete_refused
  FROM {schema}.issue_filing f
  LEFT JOIN {schema}.issue_report r ON r.report_id = f.report_id
 WHERE f.report_id = %(report)s
   FOR UPDATE OF f

-- name: start_filing
-- FILE_ISSUE is about to write: the filing says so (an erasure from now on scrubs the
-- issue), with the repository and the time the next listing starts from.
-- Conditional on the state, so that no state the table forbids is ever asked for.
UPDATE {schema}.issue_filing
   SET state = CASE WHEN state = ANY(%(from)s::text[]) THEN 'FILING' ELSE state END,
       repository = %(repository)s, last_write_at = now()
 WHERE report_id = %(report)s
RETURNING last_write_at

-- name: note_write
-- Any other kind is about to write: the time its listing or reading starts from.
UPDATE {schema}.issue_filing SET last_write_at = now() WHERE report_id = %(report)s

-- name: set_node_id
UPDATE {schema}.issue_filing SET issue_node_id = %(node_id)s WHERE report_id = %(report)s

-- name: filed
UPDATE {schema}.issue_filing
   SET state = 'FILED', issue_number = %(number)s, issue_url = %(url)s,
       filed_generation = %(generation)s, published_generation = %(generation)s,
       stop_reason = NULL, stopped_by = NULL, last_error = NULL
 WHERE report_id = %(report)s AND state = ANY(%(from)s::text[])
RETURNING report_id

-- name: stopped
UPDATE {schema}.issue_filing
   SET state = 'STOPPED', stop_reason = %(reason)s, stopped_by = %(kind)s
 WHERE report_id = %(report)s AND state = ANY(%(from)s::text[])
RETURNING report_id

-- name: published
-- A publish ended: DONE brings the filing back to FILED (after a re-draft it was ANSWERED);
-- any other ending keeps the issue filed and names what stopped the publish.
UPDATE {schema}.issue_filing
   SET state = CASE WHEN state = ANY(%(from)s::text[]) THEN 'FILED' ELSE state END,
       published_generation = CASE WHEN %(done)s THEN %(generation)s
                                   ELSE published_generation END,
       last_error = CASE WHEN %(done)s THEN NULL ELSE %(error)s END
 WHERE report_id = %(report)s
RETURNING state

-- name: transferred
UPDATE {schema}.issue_filing
   SET repository = %(repository)s, issue_number = %(number)s, issue_url = %(url)s,
       private = true, last_error = NULL
 WHERE report_id = %(report)s

-- name: scrubbed
-- CLEANUP_ISSUE DONE: what is left published is what the scrub could not remove (the edit
-- history), or nothing.
UPDATE {schema}.issue_filing
   SET scrubbed_at = now(), issue_deleted = %(deleted)s,
       history_retains_text = %(retained)s, last_error = NULL,
       still_published = %(published)s
 WHERE report_id = %(report)s

-- name: delete_refused
-- The tracker refused to delete the issue: the cleanup scrubs it instead, and says why here.
UPDATE {schema}.issue_filing SET delete_refused = %(why)s WHERE report_id = %(report)s

-- name: failed_note
UPDATE {schema}.issue_filing SET last_error = %(error)s WHERE report_id = %(report)s

-- name: draft_state
-- outbox-draft: DRAFT_CLAIMED, DRAFT_WAITING or ANSWERED, from a state that allows it.
UPDATE {schema}.issue_filing SET state = %(state)s
 WHERE report_id = %(report)s AND state = ANY(%(from)s::text[])
RETURNING report_id

-- name: keep_answer
UPDATE {schema}.issue_filing
   SET draft_generation = %(generation)s, draft_title = %(title)s, draft_body = %(body)s
 WHERE report_id = %(report)s AND generation = %(generation)s AND erased_at IS NULL
RETURNING report_id

-- name: report_content
-- An edit measures the new generation with what it does not replace, a re-draft without new
-- text drafts the stored one, and the kinds' enqueue checks measure the stored generation.
SELECT title, text, generation FROM {schema}.issue_report WHERE report_id = %(report)s

-- name: refile
-- GitHub refused the filing's content (nothing was filed): the new generation is filed.
UPDATE {schema}.issue_filing
   SET state = 'NEW', stop_reason = NULL, stopped_by = NULL, last_error = NULL
 WHERE report_id = %(report)s AND state = 'STOPPED' AND stop_reason = %(reason)s

-- name: drop_answer
-- outbox-draft: a draft that ended without DONE keeps no answer for its generation (an earlier
-- attempt of it may have kept one before its ending was lost).
UPDATE {schema}.issue_filing
   SET draft_generation = NULL, draft_title = NULL, draft_body = NULL
 WHERE report_id = %(report)s AND draft_generation = %(generation)s
RETURNING report_id

-- name: reports_of_subject
SELECT r.report_id
  FROM {schema}.issue_report r
 WHERE r.reporter_account_id = %(subject)s
 ORDER BY r.report_id
   FOR UPDATE

-- name: lane_unstarted
-- The report's actions that have not started (an erasure cancels them).
SELECT id FROM {schema}.agent_action
 WHERE lane_key = %(lane)s AND state IN ('PROPOSED', 'ADMITTED') AND write_started_at IS NULL
 ORDER BY id

-- name: lane_written
-- Whether an action of the report's lane has a write in flight or done.
SELECT EXISTS (
    SELECT 1 FROM {schema}.agent_action
     WHERE lane_key = %(lane)s AND write_started_at IS NOT NULL
)

-- name: erase_report
DELETE FROM {schema}.issue_report WHERE report_id = %(report)s

-- name: erase_filing_text
-- The erasure keeps no person data on the filing, and says what of the reporter's is still
-- published (NULL: nothing was written, or a later cleanup will say).
UPDATE {schema}.issue_filing
   SET draft_title = NULL, draft_body = NULL, erased_at = now(),
       still_published = coalesce(%(published)s, still_published)
 WHERE report_id = %(report)s
RETURNING report_id

-- name: filing
SELECT report_id, workspace_id, state, generation, repository, issue_number, issue_url,
       issue_node_id, filed_generation, published_generation, private, stop_reason,
       stopped_by, last_error, erased_at, scrubbed_at, issue_deleted, history_retains_text,
       draft_generation, draft_title IS NOT NULL, delete_refused, still_published
  FROM {schema}.issue_filing
 WHERE report_id = %(report)s

-- name: relocated
-- A publish found the issue where a person moved it: the filing follows.
UPDATE {schema}.issue_filing
   SET repository = %(repository)s, issue_number = %(number)s, issue_url = %(url)s
 WHERE report_id = %(report)s AND issue_url IS DISTINCT FROM %(url)s
