"""``FILE_ISSUE`` and ``PUBLISH_REPORT``: the two kinds that write an issue's content, and the
enqueue check they share (the content must fit what GitHub takes)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, cast

from psycopg import AsyncConnection, Connection

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
    StopReason,
)
from outbox_core.steps import Query, Steps, arun, run

from . import markers
from .adapter_base import (
    FILE_ISSUE,
    PUBLISH_REPORT,
    GenerationPayload,
    TrackerAdapter,
    content_of,
    issue_location,
    report_of,
)
from .content import check_fits
from .domain import FilingState, queries, sources
from .tracker import (
    NotSent,
    TrackerError,
)
from .tracker_results import NO_FILING, REPORT_ERASED, UNKNOWN_REPORT, listing_lag


class IssueContentCheck(TrackerAdapter):
    """The enqueue check of the kinds that write an issue's content (``FILE_ISSUE``,
    ``PUBLISH_REPORT``): the stored report of the payload's generation must make an issue
    GitHub takes whole (:func:`content.check_fits`), else the request is refused before
    anything is written. ``submit_report`` and ``edit_report`` measure what they are about to
    store themselves: their report is not stored when the check runs, so it passes here."""

    kind: ClassVar[str] = "ISSUE_CONTENT_BASE"

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        run(conn, cls._content_steps(check))

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        await arun(conn, cls._content_steps(check))

    @classmethod
    def _content_steps(cls, check: EnqueueCheck) -> Steps[None]:
        payload = cast(GenerationPayload, check.body)
        report_id = payload.report
        rows = yield Query(queries(check.schema)["report_content"], {"report": report_id})
        if not rows or rows[0][2] != payload.generation:
            return  # not stored yet (submit, edit: they measure it), or another generation
        title, text, generation = rows[0]
        keys = () if cls.kind == FILE_ISSUE else (check.request.idempotency_key,)
        check_fits(report_id, title, text, generation, keys)


class FileIssueAdapter(IssueContentCheck):
    """``FILE_ISSUE``: create the report's issue (title, body, labels), once."""

    kind = FILE_ISSUE

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(GenerationPayload)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        missing = self.missing_settings(attempt)
        if missing is not None:
            return missing
        payload = cast(GenerationPayload, attempt.body)
        report_id = payload.report
        facts = await self.read(attempt, report_id)
        if facts is None:
            return Failed(UNKNOWN_REPORT, detail=NO_FILING)
        repository = facts.repository or cast(str, self.settings.repository)
        if attempt.write_started:
            try:
                issue, complete = await self.find_filed(attempt, report_id, facts, [repository])
            except TrackerError as error:
                return self.failure(attempt, error)
            if issue is not None:
                self.event("issues.found_by_marker", attempt, logging.INFO, number=issue.number)
                return Done(issue.html_url)
            if not complete:
                self.event("issues.listing_incomplete", attempt, logging.WARNING)
                return self.incomplete()
            wait = self.too_soon(attempt, facts)
            if wait is not None:
                return listing_lag(wait)
            self.event("issues.absent_after_write", attempt, logging.WARNING)
        # The report may have been erased since: decide under the filing's lock, and say on
        # the filing that a write starts (an erasure from now on scrubs what it writes).
        async with attempt.transaction() as conn:
            facts = await self._read(conn, report_id)
            if facts is None:
                return Failed(UNKNOWN_REPORT, detail=NO_FILING)
            if not facts.report_exists:
                reason = StopReason.ABSENT if attempt.write_started else REPORT_ERASED
                return Cancelled(reason)
            await conn.execute(
                self.queries["start_filing"],
                {
                    "report": report_id,
                    "repository": repository,
                    "from": sources(FilingState.FILING),
                },
            )
        content = content_of(report_id, facts, payload.generation, self.settings.labels, ())
        self.shortened(attempt, content)
        if not await attempt.fence().begin_write():
            return Abandoned()
        try:
            issue = await self.tracker().create_issue(
                repository, title=content.title, body=content.body, labels=content.labels
            )
        except TrackerError as error:
            return self.failure(attempt, error, wrote=not isinstance(error, NotSent))
        self.event("issues.filed", attempt, logging.INFO, number=issue.number)
        return Done(issue.html_url)

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        report_id, generation = report_of(action.idempotency_key)
        if action.state is ActionState.DONE and action.readback_ref:
            _, number = issue_location(action.readback_ref)
            await conn.execute(
                self.queries["filed"],
                {
                    "report": report_id,
                    "number": number,
                    "url": action.readback_ref,
                    "generation": generation,
                    "from": sources(FilingState.FILED),
                },
            )
            return
        await conn.execute(
            self.queries["stopped"],
            {
                "report": report_id,
                "reason": action.stop_reason,
                "kind": action.kind,
                "from": sources(FilingState.STOPPED),
            },
        )


class PublishReportAdapter(IssueContentCheck):
    """``PUBLISH_REPORT`` (``/publish``): bring the filed issue to the report's generation."""

    kind = PUBLISH_REPORT

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(GenerationPayload)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        missing = self.missing_settings(attempt)
        if missing is not None:
            return missing
        payload = cast(GenerationPayload, attempt.body)
        report_id = payload.report
        filed = await self.read_filed(attempt, report_id)
        if isinstance(filed, Failed):
            return filed
        facts, repository, number = filed
        if not facts.report_exists:
            return Cancelled(REPORT_ERASED)
        content = content_of(
            report_id, facts, payload.generation, self.settings.labels, (attempt.idempotency_key,)
        )
        self.shortened(attempt, content)
        marker = markers.content_marker(report_id, payload.generation, content.digest)
        tracker = self.tracker()
        # Read first, every attempt: the issue already showing this content is Done.
        try:
            issue = await tracker.get_issue(repository, number)
        except TrackerError as error:
            return self.failure(attempt, error)
        if markers.has_marker(issue.body, marker):
            return Done(issue.html_url)
        repository, number = issue_location(issue.html_url)  # where it is now
        async with attempt.transaction() as conn:
            await conn.execute(self.queries["note_write"], {"report": report_id})
        if not await attempt.fence().begin_write():
            return Abandoned()
        try:
            issue = await tracker.update_issue(
                repository,
                number,
                title=content.title,
                body=content.body,
                labels=content.labels,
            )
        except TrackerError as error:
            return self.failure(attempt, error, wrote=not isinstance(error, NotSent))
        self.event("issues.published", attempt, logging.INFO, number=issue.number)
        return Done(issue.html_url)

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        report_id, generation = report_of(action.idempotency_key)
        done = action.state is ActionState.DONE
        await conn.execute(
            self.queries["published"],
            {
                "report": report_id,
                "generation": generation,
                "done": done,
                "error": None if done else f"{action.kind} {action.state}: {action.stop_reason}",
                "from": sources(FilingState.FILED),
            },
        )
        if done and action.readback_ref:
            await self.locate(conn, "relocated", report_id, action.readback_ref)
