"""The adapters of ``DELIVER_FEEDBACK``, ``EDIT_FEEDBACK`` and ``RETRACT_FEEDBACK``: the only
code of this package that calls the tracker (through ``outbox_issues.tracker.GitHubTracker``,
the one tracker client of outbox; the settings are outbox-issues', ``OUTBOX_ISSUES_*``).

Longer than 450 lines on purpose: the three kinds are one adapter (one attempt that reads the
copies back and writes each under its own fence, one ``ended`` hook that may queue the
correction with these very classes), and a sixth of it is the table below.

A send brings the feedback's copies on the pull request (the summary as a conversation
comment, each inline item as a review comment on its line) to what the feedback decided:
deliver and edit create what is missing, change what differs (an edit that finds its copy gone
creates it again; GitHub edits only a review comment's body, so an item that moved to another
line is deleted and created again) and delete the copies of items no longer decided; retract
deletes every copy (one already gone is fine).

**Copies with their own fences.** Before each copy's write the send calls ``begin_write()``,
then records in ``attempt.transaction()``, committed before the provider call, that the copy's
write may have started (``feedback_copy.state = 'writing'``); after the answer it confirms the
copy in another ``attempt.transaction()``. An attempt starts by reading the copy rows: a copy
whose write may have reached the tracker is read back by its marker (one listing of the pull
request's comments or review comments, every page) before anything else is written. Only a
comment the token's own identity wrote is taken for a copy (``GitHubTracker.identity``): a
copy marker is predictable, and one that anyone else planted is ignored and counted
(``readback.foreign_marker``), never edited or deleted as if it were the copy.

Answers become results as in ``outbox_issues.adapter.result_for``, with one difference: once a
copy of this attempt may have been written, a rate limit or a refused connection is a Reread
(a Defer or a Retry would clear the action's fence while the tracker holds a copy).

=========================================================  ===================================
what happened                                              result
=========================================================  ===================================
every copy as decided                                      Done, ``readback_ref`` = the
                                                           summary comment's URL (None after
                                                           a retract)
connection refused before any copy of this attempt was     Retry
written
primary or secondary rate limit, before any copy of this   Defer (``x-ratelimit-reset``,
attempt was written                                        ``retry-after``)
rate limit or refused connection after a copy of this      Reread (after the limit's wait)
attempt may have been written
401, 403, 404 on the pull request, 410, 422 (a line that   Failed, ``GITHUB_<status>``
is not in the diff)
a 422 on a copy's body (checked when the feedback was      Failed, ``CONTENT_REFUSED``
stored; refused all the same)
a 404 on the edit or delete of one copy                    the copy is gone: created again
                                                           (edit), or settled (delete)
a timeout, a dropped connection after the request was      Reread: the next attempt reads the
sent, a 5xx                                                copy back by its marker
a listing of more than ``max_pages`` pages                 Reread
a copy written less than ``listing_lag_seconds`` ago and   Reread (its comment may be missing
missing from the listing                                   from listings for a while)
the feedback was erased                                    Cancelled, ``FEEDBACK_ERASED``
=========================================================  ===================================

The ``ended`` hook of every send runs in the executor's ending batch, beside other kinds'
endings: it takes the feedback's row lock under a short ``lock_timeout`` (an application
transaction that holds the row fails the hook, and the core writes the other endings of the
batch without it), projects the copies that the send left unsettled (``unknown``), records the
send's end on the feedback, and queues one correction when a decision or a mark committed
while the send ran (the feedback's revision passed the one the send carried).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any, ClassVar, cast

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel, ConfigDict, Field

from outbox_core import (
    Abandoned,
    Action,
    ActionAttempt,
    ActionState,
    ActionVariants,
    AdapterResult,
    Cancelled,
    Done,
    EnqueueCheck,
    Failed,
    KindRegistry,
    Outbox,
    Reread,
    StopReason,
)
from outbox_core.steps import Query, Steps, arun, run
from outbox_issues.adapter import STOP_REASONS as TRACKER_STOP_REASONS
from outbox_issues.adapter import TrackerAdapter, listing_lag, result_for
from outbox_issues.tracker import NotSent, RateLimited, Refused, TrackerError, Unanswered

from .copies import (
    SUMMARY,
    CopyRow,
    CopyState,
    Item,
    Op,
    Wanted,
    check_copies,
    digest_in,
    item_copy,
    position_of,
    summary_copy,
    writes_for,
)
from .domain import VARIANTS, feedback_of, lane, queries, send_request

DELIVER_FEEDBACK = "DELIVER_FEEDBACK"
EDIT_FEEDBACK = "EDIT_FEEDBACK"
RETRACT_FEEDBACK = "RETRACT_FEEDBACK"
KINDS = (DELIVER_FEEDBACK, EDIT_FEEDBACK, RETRACT_FEEDBACK)

SUPERSEDED = "SUPERSEDED"
"""The stop reason of an unstarted send that a newer send of its feedback replaced."""
FEEDBACK_ERASED = "FEEDBACK_ERASED"
"""The feedback is gone (its author was erased) when the send reads it."""
STOP_REASONS = TRACKER_STOP_REASONS | {SUPERSEDED, FEEDBACK_ERASED}


class SendPayload(BaseModel):
    """Every send: the feedback, nothing more; the adapter reads the rest."""

    model_config = ConfigDict(extra="forbid")
    feedback: str = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Facts:
    """The feedback as one attempt read it (under its lease and the feedback's lock)."""

    feedback_id: str
    repository: str
    pull_number: int
    revision: int
    now: datetime
    wanted: dict[str, Wanted | None]
    """Each copy by item: what it should hold (None: it should not exist)."""
    copies: dict[str, CopyRow]


class FeedbackAdapter(TrackerAdapter):
    """What the three send kinds share; ``retracting`` says whether the send deletes every
    copy whatever was decided."""

    kind: ClassVar[str] = "FEEDBACK_BASE"
    retracting: ClassVar[bool] = False
    stop_reasons = STOP_REASONS
    event_prefix = "feedback"
    ended_lock_timeout_ms: ClassVar[int] = 250
    """How long the ended hook waits for the feedback's row lock in the ending batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.named = queries(self.schema)

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.key_suffix(VARIANTS, SendPayload)

    # -- at enqueue ----------------------------------------------------------------------------

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        """The copies this send will write, as the caller's transaction holds the feedback,
        must each be a comment GitHub takes whole (:func:`copies.check_copies`, with this
        send's own key): refused before anything is written, on every enqueue path."""
        run(conn, cls._copies_steps(check))

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        await arun(conn, cls._copies_steps(check))

    @classmethod
    def _copies_steps(cls, check: EnqueueCheck) -> Steps[None]:
        feedback_id = cast(SendPayload, check.body).feedback
        named = queries(check.schema)
        rows = yield Query(named["sent_content"], {"feedback": feedback_id})
        if cls.retracting or not rows or rows[0][1]:
            return  # a retract writes no copy; an unknown feedback is the queue's to refuse
        items = yield Query(named["items_of"], {"feedback": feedback_id})
        stored = [Item(*row) for row in items]
        check_copies(feedback_id, rows[0][0], stored, check.request.idempotency_key)

    # -- execute -------------------------------------------------------------------------------

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if self.settings.token is None:
            self.event(
                "feedback.not_configured", attempt, logging.ERROR, missing="OUTBOX_ISSUES_TOKEN"
            )
            return Failed(
                StopReason.NOT_CONFIGURED, detail="not configured: OUTBOX_ISSUES_TOKEN unset"
            )
        feedback_id = cast(SendPayload, attempt.body).feedback
        async with attempt.transaction() as conn:
            facts = await self._read_feedback(conn, attempt, feedback_id)
        if facts is None:
            return Cancelled(FEEDBACK_ERASED)
        read = await self._read_back(attempt, facts)
        if not isinstance(read, Facts):
            return read
        facts = read
        wrote = False
        for item_id, wanted in facts.wanted.items():
            for op in writes_for(wanted, facts.copies.get(item_id)):
                outcome = await self._write(attempt, facts, item_id, wanted, op, wrote)
                if not isinstance(outcome, Facts):
                    return outcome
                facts, wrote = outcome, True
        summary = facts.copies.get(SUMMARY)
        url = summary.url if summary is not None and summary.state is CopyState.PRESENT else None
        self.event("feedback.sent", attempt, logging.INFO, copies=len(facts.wanted), wrote=wrote)
        return Done(url)

    async def _read_feedback(
        self, conn: AsyncConnection[Any], attempt: ActionAttempt, feedback_id: str
    ) -> Facts | None:
        """The feedback, its items and its copies; says on the feedback which revision this
        send carries (so a decision that commits after this is owed a correction)."""
        named = self.named
        params = {"feedback": feedback_id}
        cursor = await conn.execute(named["read_for_send"], params)
        row = await cursor.fetchone()
        if row is None:
            return None
        repository, pull_number, summary, revision, retracted, now = row
        await conn.execute(named["start_send"], {**params, "action": attempt.id})
        wanted: dict[str, Wanted | None] = {}
        if not (self.retracting or retracted):
            wanted[SUMMARY] = summary_copy(feedback_id, summary)
            cursor = await conn.execute(named["items_of"], params)
            for item_row in await cursor.fetchall():
                item = Item(*item_row)
                wanted[item.item_id] = item_copy(feedback_id, item)
        for copy in wanted.values():
            assert copy is not None
            await conn.execute(
                named["ensure_copy"],
                {**params, "item": copy.item_id, "surface": copy.surface, "marker": copy.marker},
            )
        cursor = await conn.execute(named["copies_of"], params)
        copies = {r.item_id: r for r in map(CopyRow.from_row, await cursor.fetchall())}
        for item_id in copies:
            wanted.setdefault(item_id, None)  # an item no longer decided: its copy goes
        return Facts(feedback_id, repository, pull_number, revision, now, wanted, copies)

    async def _read_back(self, attempt: ActionAttempt, facts: Facts) -> Facts | AdapterResult:
        """Every copy whose write may have reached the tracker, read back by its marker (one
        listing per surface, every page) and settled, before anything is written."""
        pending = [row for row in facts.copies.values() if row.state.may_exist_unconfirmed]
        if not pending:
            return facts
        tracker = self.tracker()
        found: dict[str, Any] = {}
        try:
            for surface in ("comment", "review_comment"):
                markers = [row.marker for row in pending if row.surface == surface]
                if not markers:
                    continue
                find = (
                    tracker.find_comments if surface == "comment" else tracker.find_review_comments
                )
                listed = await find(
                    facts.repository, facts.pull_number, markers, max_pages=self.settings.max_pages
                )
                self.foreign_markers(attempt, listed, f"{surface}s")
                if not listed.complete:
                    self.event("feedback.listing_incomplete", attempt, logging.WARNING)
                    return self.incomplete()
                assert listed.item is not None
                found.update(listed.item)
        except TrackerError as error:
            return self.failure(attempt, error, wrote=True)
        lag = timedelta(seconds=self.settings.listing_lag_seconds)
        copies = dict(facts.copies)
        async with attempt.transaction() as conn:
            for row in pending:
                comment = found.get(row.marker)
                if comment is not None:
                    copies[row.item_id] = await self._present(conn, facts, row, comment)
                    self.event("feedback.found_by_marker", attempt, logging.INFO, item=row.item_id)
                    continue
                started = row.write_started_at
                if row.write_op == "create" and started is not None and started + lag > facts.now:
                    # A new comment can be missing from listings for a while: look again.
                    return listing_lag(started + lag - facts.now)
                copies[row.item_id] = await self._absent(conn, facts, row)
        return replace(facts, copies=copies)

    async def _write(
        self,
        attempt: ActionAttempt,
        facts: Facts,
        item_id: str,
        wanted: Wanted | None,
        op: Op,
        wrote: bool,
    ) -> Facts | AdapterResult:
        """One copy's write behind its own fence: begin_write(), the copy says its write may
        have started (committed), the call, then the copy confirmed."""
        row = facts.copies[item_id]
        if not await attempt.fence().begin_write():
            return Abandoned()
        params = {"feedback": facts.feedback_id, "item": item_id}
        async with attempt.transaction() as conn:
            await conn.execute(
                self.named["copy_writing"],
                {
                    **params,
                    "op": op,
                    "digest": wanted.digest if wanted is not None else None,
                    "action": attempt.id,
                },
            )
        tracker = self.tracker()
        repository, pull = facts.repository, facts.pull_number
        try:
            if op == "delete":
                assert row.provider_id is not None
                if row.surface == "comment":
                    await tracker.delete_comment(repository, row.provider_id)
                else:
                    await tracker.delete_review_comment(repository, row.provider_id)
                answer: Any = None
            else:
                assert wanted is not None
                body = wanted.body(attempt.idempotency_key)
                if op == "update":
                    assert row.provider_id is not None
                    update = (
                        tracker.update_comment
                        if row.surface == "comment"
                        else tracker.update_review_comment
                    )
                    answer = await update(repository, row.provider_id, body)
                elif wanted.item is None:
                    answer = await tracker.create_comment(repository, pull, body)
                else:
                    item = wanted.item
                    answer = await tracker.create_review_comment(
                        repository,
                        pull,
                        body,
                        commit_id=item.commit_id,
                        path=item.path,
                        line=item.line,
                        side=item.side,
                    )
        except TrackerError as error:
            gone = isinstance(error, Refused) and error.status in (404, 410) and op != "create"
            if isinstance(error, Unanswered):
                return self.failure(attempt, error, wrote=True)
            async with attempt.transaction() as conn:
                if gone:
                    settled = await self._absent(conn, facts, row)
                else:
                    await conn.execute(self.named["copy_unwritten"], params)
            if not gone:
                return self.failure(attempt, error, wrote=wrote)
            facts = replace(facts, copies={**facts.copies, item_id: settled})
            if op == "update":  # the edit found its copy gone: create it again
                self.event("feedback.copy_gone", attempt, logging.INFO, item=item_id)
                return await self._write(attempt, facts, item_id, wanted, "create", wrote)
            return facts
        async with attempt.transaction() as conn:
            if op == "delete":
                settled = await self._absent(conn, facts, row)
            else:
                settled = await self._present(conn, facts, row, answer)
        return replace(facts, copies={**facts.copies, item_id: settled})

    async def _present(
        self, conn: AsyncConnection[Any], facts: Facts, row: CopyRow, comment: Any
    ) -> CopyRow:
        position = (
            position_of(comment.path, comment.commit_id, comment.line, comment.side)
            if row.surface == "review_comment"
            else None
        )
        digest = digest_in(comment.body)
        await conn.execute(
            self.named["copy_present"],
            {
                "feedback": facts.feedback_id,
                "item": row.item_id,
                "provider_id": comment.id,
                "url": comment.html_url,
                "digest": digest,
                "position": position,
            },
        )
        return replace(
            row,
            state=CopyState.PRESENT,
            provider_id=comment.id,
            url=comment.html_url,
            confirmed_digest=digest,
            confirmed_position=position,
            write_op=None,
            write_digest=None,
            write_action=None,
            write_started_at=None,
        )

    async def _absent(self, conn: AsyncConnection[Any], facts: Facts, row: CopyRow) -> CopyRow:
        await conn.execute(
            self.named["copy_absent"], {"feedback": facts.feedback_id, "item": row.item_id}
        )
        return replace(
            row,
            state=CopyState.ABSENT,
            provider_id=None,
            url=None,
            confirmed_digest=None,
            confirmed_position=None,
            write_op=None,
            write_digest=None,
            write_action=None,
            write_started_at=None,
        )

    def result_of(self, attempt: ActionAttempt, error: TrackerError, wrote: bool) -> AdapterResult:
        """``result_for``'s answer, except that once a copy of this attempt may have been
        written, a rate limit or a refused connection keeps the fence (Reread). The copy rows,
        not the action's fence, say what earlier attempts may have written."""
        if wrote and isinstance(error, RateLimited):
            wait = error.wait_seconds
            return Reread(
                after=timedelta(seconds=wait), detail=f"{error.detail}, waiting {wait:g} s"
            )
        if wrote and isinstance(error, NotSent):
            return Reread(detail=error.detail)
        return result_for(error, may_have_written=wrote)

    # -- ended ---------------------------------------------------------------------------------

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        feedback_id = feedback_of(action.lane_key)
        named = self.named
        params: dict[str, Any] = {"feedback": feedback_id, "action": action.id}
        cursor = await conn.execute("SELECT current_setting('lock_timeout')")
        before = (await cursor.fetchone() or ("0",))[0]
        await conn.execute(
            "SELECT set_config('lock_timeout', %s, true)", (f"{self.ended_lock_timeout_ms}ms",)
        )
        cursor = await conn.execute(named["lock_feedback_ending"], params)
        row = await cursor.fetchone()
        await conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
        if row is None:
            return  # erased: nothing to record, nothing owed
        revision, retracted, sending_action, sending_revision, workspace, author, sends = row
        await conn.execute(named["project_copies"], params)
        await conn.execute(
            named["send_ended"],
            {
                **params,
                "key": action.idempotency_key,
                "state": str(action.state),
                "reason": action.stop_reason,
                "done": action.state is ActionState.DONE,
            },
        )
        if action.stop_reason == SUPERSEDED or sending_action != action.id:
            return  # replaced, or never read the feedback: it carried nothing
        if sending_revision is not None and revision <= sending_revision:
            return
        # A decision or a mark committed while this send ran: one correction, queued here
        # under the feedback's lock (queue refused the caller with 409 meanwhile).
        outbox = _own_outbox(self.schema)
        live = await outbox.alane(conn, lane(feedback_id), decode=False)
        if any(other.id != action.id for other in live):
            return  # a later send is queued already: it carries the decision
        await conn.execute(named["next_send"], {"feedback": feedback_id})
        request = send_request(
            RETRACT_FEEDBACK if retracted else EDIT_FEEDBACK,
            feedback_id,
            int(sends) + 1,
            workspace=workspace,
            author=author,
        )
        queued = await outbox.aenqueue(conn, request)
        self.ended_event(
            "feedback.correction_queued", action, correction=queued.id, revision=revision
        )


class DeliverFeedbackAdapter(FeedbackAdapter):
    """``DELIVER_FEEDBACK``: the feedback's first send, which creates its copies."""

    kind = DELIVER_FEEDBACK


class EditFeedbackAdapter(FeedbackAdapter):
    """``EDIT_FEEDBACK``: brings the copies to a later decision or mark."""

    kind = EDIT_FEEDBACK


class RetractFeedbackAdapter(FeedbackAdapter):
    """``RETRACT_FEEDBACK``: deletes every copy."""

    kind = RETRACT_FEEDBACK
    retracting = True


ADAPTERS: tuple[type[FeedbackAdapter], ...] = (
    DeliverFeedbackAdapter,
    EditFeedbackAdapter,
    RetractFeedbackAdapter,
)


@cache
def _own_outbox(schema: str) -> Outbox:
    """An Outbox of this package's kinds, for the correction the ended hook enqueues (enqueue
    checks the request against the kind's declarations, which are these classes')."""
    registry = KindRegistry()
    for adapter in ADAPTERS:
        registry.register(adapter, distribution="outbox-feedback")
    return Outbox(schema=schema, registry=registry)
