"""``TRANSFER_ISSUE`` (Make private: the issue moves to the private repository, read back by
its GraphQL node id) and ``CLEANUP_ISSUE`` (after an erasure: the issue scrubbed or deleted,
and the comments that quote the report deleted)."""

from __future__ import annotations

import logging
from typing import Any, cast

from psycopg import AsyncConnection

from outbox_core import (
    Abandoned,
    Action,
    ActionAttempt,
    ActionState,
    ActionVariants,
    AdapterResult,
    Done,
    Failed,
    Reread,
)

from . import markers
from .adapter_base import (
    CLEANUP_ISSUE,
    TRANSFER_ISSUE,
    Facts,
    ReportPayload,
    TrackerAdapter,
    issue_location,
    report_of,
)
from .tracker import (
    GraphQLRefused,
    Issue,
    NotSent,
    Refused,
    TrackerError,
)
from .tracker_results import GRAPHQL_REASONS, listing_lag

DELETED, SCRUBBED = "#deleted", "#scrubbed"


def in_history(url: str) -> str:
    """What a scrub leaves published: the issue's earlier bodies in GitHub's edit history."""
    return (
        f"earlier versions of {url} in GitHub's edit history (readable by anyone who can read "
        "the issue; GitHub has no API to remove a revision: remove them in its web UI, or ask "
        "GitHub Support)"
    )


class TransferIssueAdapter(TrackerAdapter):
    """``TRANSFER_ISSUE`` (Make private): move the filed issue to the private repository."""

    kind = TRANSFER_ISSUE

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(ReportPayload)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        missing = self.missing_settings(attempt, private=True)
        if missing is not None:
            return missing
        target = cast(str, self.settings.private_repository)
        report_id = cast(ReportPayload, attempt.body).report
        filed = await self.read_filed(attempt, report_id)
        if isinstance(filed, Failed):
            return filed
        facts, at, number = filed
        if facts.repository == target and facts.issue_url is not None:
            return Done(facts.issue_url)
        tracker = self.tracker()
        try:
            node_id = facts.issue_node_id
            if node_id is None:
                node_id = (await tracker.get_issue(at, number)).node_id
                async with attempt.transaction() as conn:
                    await conn.execute(
                        self.queries["set_node_id"], {"report": report_id, "node_id": node_id}
                    )
            # Read first, every attempt: an earlier attempt (or a person) may have moved it.
            node = await tracker.issue_by_node(node_id)
            if node is None:
                return Failed(
                    GRAPHQL_REASONS["NOT_FOUND"], detail="GraphQL node: the issue is gone"
                )
            if node.repository == target:
                return Done(node.url)
            repository = await tracker.repository(target)
        except TrackerError as error:
            return self.failure(attempt, error)
        if not await attempt.fence().begin_write():
            return Abandoned()
        try:
            moved = await tracker.transfer_issue(node_id, repository.node_id)
        except GraphQLRefused as error:
            # A transfer that a stale read did not show yet is refused as already there: read
            # once more before calling it a failure.
            try:
                node = await tracker.issue_by_node(node_id)
            except TrackerError:
                node = None
            if node is not None and node.repository == target:
                return Done(node.url)
            return self.failure(attempt, error, wrote=True)
        except TrackerError as error:
            return self.failure(attempt, error, wrote=not isinstance(error, NotSent))
        self.event("issues.transferred", attempt, logging.INFO, number=moved.number)
        return Done(moved.url)

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        report_id, _ = report_of(action.idempotency_key)
        if action.state is ActionState.DONE and action.readback_ref:
            await self.locate(conn, "transferred", report_id, action.readback_ref)
            return
        await conn.execute(
            self.queries["failed_note"],
            {"report": report_id, "error": f"{action.kind} {action.state}: {action.stop_reason}"},
        )


class CleanupIssueAdapter(TrackerAdapter):
    """``CLEANUP_ISSUE``: after an erasure of the reporter, scrub the filed issue (or delete
    it, with ``delete_on_erasure``) and delete this package's comments that quote the text."""

    kind = CLEANUP_ISSUE

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(ReportPayload)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        missing = self.missing_settings(attempt)
        if missing is not None:
            return missing
        report_id = cast(ReportPayload, attempt.body).report
        facts = await self.read(attempt, report_id)
        if facts is None:
            return Done(None)
        try:
            issue = await self._locate(attempt, report_id, facts)
        except TrackerError as error:
            if isinstance(error, Refused) and error.status == 410:
                # Deleted (by an earlier attempt whose answer was lost, or by a person).
                return Done(facts.issue_url + DELETED if facts.issue_url else None)
            return self.failure(attempt, error)
        if isinstance(issue, Reread):
            return issue
        if issue is None:
            self.event("issues.cleanup.nothing_filed", attempt, logging.INFO)
            return Done(None)
        repository, _ = issue_location(issue.html_url)
        if self.settings.delete_on_erasure and facts.delete_refused is None:
            deleted = await self._delete(attempt, report_id, issue)
            if deleted is not None:
                return deleted
        return await self._scrub(attempt, report_id, repository, issue)

    async def _locate(
        self, attempt: ActionAttempt, report_id: str, facts: Facts
    ) -> Issue | Reread | None:
        """The issue to clean: by number when the filing knows it, else by its marker."""
        tracker = self.tracker()
        if facts.issue_number is not None and facts.repository is not None:
            return await tracker.get_issue(facts.repository, facts.issue_number)
        if facts.last_write_at is None:
            return None
        repositories = [
            name for name in (facts.repository or self.settings.repository,) if name is not None
        ]
        issue, complete = await self.find_filed(attempt, report_id, facts, repositories)
        if issue is not None:
            return issue
        if not complete:
            return self.incomplete()
        wait = self.too_soon(attempt, facts)
        return listing_lag(wait) if wait is not None else None

    async def _delete(
        self, attempt: ActionAttempt, report_id: str, issue: Issue
    ) -> AdapterResult | None:
        """Delete the issue (GraphQL ``deleteIssue``). None when the tracker refuses the delete
        (a GraphQL without the mutation, ``FORBIDDEN`` for a token without admin rights, a
        404): nothing was deleted, the filing says why, and the issue is scrubbed instead."""
        tracker = self.tracker()
        if attempt.write_started:
            try:
                if await tracker.issue_by_node(issue.node_id) is None:
                    return Done(issue.html_url + DELETED)
            except TrackerError as error:
                return self.failure(attempt, error)
        if not await attempt.fence().begin_write():
            return Abandoned()
        try:
            await tracker.delete_issue(issue.node_id)
        except (Refused, GraphQLRefused) as refused:
            why = f"deleteIssue refused: {refused.detail}"
            async with attempt.transaction() as conn:
                await conn.execute(
                    self.queries["delete_refused"], {"report": report_id, "why": why}
                )
            self.event("issues.cleanup.delete_refused", attempt, logging.WARNING, detail=why)
            return None
        except TrackerError as error:
            return self.failure(attempt, error, wrote=not isinstance(error, NotSent))
        self.event("issues.cleanup.deleted", attempt, logging.INFO, number=issue.number)
        return Done(issue.html_url + DELETED)

    async def _scrub(
        self, attempt: ActionAttempt, report_id: str, repository: str, issue: Issue
    ) -> AdapterResult:
        tracker = self.tracker()
        title = f"Feedback report {report_id}"
        body, _ = markers.scrub(issue.body or "")
        own = markers.action_marker(attempt.idempotency_key)
        if own not in body:
            body = f"{body.rstrip()}\n{own}\n"
        try:
            if issue.title != title or body != (issue.body or ""):
                if not await attempt.fence().begin_write():
                    return Abandoned()
                try:
                    await tracker.update_issue(repository, issue.number, title=title, body=body)
                except Refused as error:
                    if error.status != 410:
                        raise
                    return Done(issue.html_url + DELETED)  # deleted meanwhile
            found = await tracker.find_own_comments(
                repository,
                issue.number,
                markers.quote_marker(report_id),
                max_pages=self.settings.max_pages,
            )
            self.foreign_markers(attempt, found, "comments")
            if not found.complete:
                self.event("issues.listing_incomplete", attempt, logging.WARNING)
                return self.incomplete()
            quoting = found.item or []
            for comment in quoting:
                if not attempt.fenced and not await attempt.fence().begin_write():
                    return Abandoned()
                try:
                    await tracker.delete_comment(repository, comment.id)
                except Refused as error:
                    if error.status != 404:  # deleted already
                        raise
        except TrackerError as error:
            return self.failure(attempt, error, wrote=attempt.fenced)
        self.event("issues.cleanup.scrubbed", attempt, logging.INFO, comments_deleted=len(quoting))
        return Done(issue.html_url + SCRUBBED)

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        """DONE: the filing says scrubbed or deleted, and what is still published (a scrub
        leaves the edit history). Any other ending keeps what the erasure recorded as still
        published, and says what stopped the cleanup (``last_error``)."""
        report_id, _ = report_of(action.idempotency_key)
        if action.state is ActionState.DONE:
            ref = action.readback_ref or ""
            retained = ref.endswith(SCRUBBED)
            await conn.execute(
                self.queries["scrubbed"],
                {
                    "report": report_id,
                    "deleted": ref.endswith(DELETED),
                    "retained": retained,
                    "published": in_history(ref.removesuffix(SCRUBBED)) if retained else None,
                },
            )
            return
        await conn.execute(
            self.queries["failed_note"],
            {"report": report_id, "error": f"{action.kind} {action.state}: {action.stop_reason}"},
        )
