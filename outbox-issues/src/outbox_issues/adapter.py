"""The adapters of ``FILE_ISSUE``, ``PUBLISH_REPORT``, ``CLEANUP_ISSUE`` and ``TRANSFER_ISSUE``:
the only code that calls the issue tracker (through :class:`~outbox_issues.tracker.GitHubTracker`).

All four read back: every write carries a marker naming the action (a hidden HTML comment with
its idempotency key), so an attempt after an unknown write finds that write before it writes
again. A tracker answer becomes a result in one place, :func:`result_for`:

=========================================================  ===================================
what happened                                              result
=========================================================  ===================================
2xx                                                        Done, ``readback_ref`` = the
                                                           issue's URL
connection refused, connect timeout: the request never     Retry (Reread when an earlier
left                                                       attempt may have written)
primary rate limit: 403 or 429 with                        Defer until ``x-ratelimit-reset``
``x-ratelimit-remaining: 0``; GraphQL ``RATE_LIMITED``     (the tracker's clock, its ``Date``)
secondary rate limit: 403 or 429 whose message says so,    Defer for ``retry-after``, at least
or with ``retry-after``                                    a minute without it
a 422 refusing the title or the body we sent (checked at   Failed, ``CONTENT_REFUSED`` (its
enqueue, refused all the same: a limit not known here)     fields in the detail; logged ERROR)
any other 403; 401; 404 and 410 on the repository; any     Failed, ``GITHUB_<status>``
other 422, 4xx or 3xx
GraphQL ``errors`` (HTTP 200) of another type              Failed, ``GRAPHQL_NOT_FOUND``,
                                                           ``GRAPHQL_FORBIDDEN`` or
                                                           ``GRAPHQL_ERROR``; never Done
a timeout, a dropped connection after the request was      Reread after the write (Retry
sent, a 5xx, a 2xx body that is not what the API           before any write of the action)
documents
=========================================================  ===================================

``FILE_ISSUE`` after an unknown write (``attempt.write_started``) lists the repository's issues
created by the identity the token writes as, ``state=all``, updated since the write's time
minus a skew margin, every page (never the search API: it is eventually consistent), and looks
for its marker. Found: Done. Listed completely at least ``listing_lag_seconds`` (2 minutes)
after the latest write, and absent: it writes again behind a new fence. Listed completely but
sooner: Reread after the lag that is left (a new issue can be missing from listings for a
while). The listing fails (a 5xx, a dropped connection, a timeout): Reread with what it saw.

Read-backs follow the core's rule (``Reread`` in ``outbox_core.results``): a Reread from an
attempt that wrote counts an attempt (UNCERTAIN ``ATTEMPTS_EXHAUSTED`` at the last); one from an
attempt that only read counts none, the core choosing the growing wait, until GitHub has been
unreadable for the kind's ``unreadable_for`` (15 minutes) since the write started: then
UNCERTAIN ``READBACK_UNAVAILABLE``. Every Reread, Defer and Failed says in its detail what the
attempt saw (``HTTP 503 Service Unavailable``, ``listing lag: ...``, ``not configured: ...``).

``PUBLISH_REPORT`` reads the issue first and compares its content marker (generation and
digest): equal is Done without a write. ``TRANSFER_ISSUE`` reads back by the issue's node id
through GraphQL (a transferred issue keeps its node id; its old REST URL answers 301).
``CLEANUP_ISSUE`` scrubs (or deletes) an issue found by number or by its filing's marker.

The client never retries a request on its own: an HTTP layer that sends a POST again could
file a second issue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast
from urllib.parse import urlsplit

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
    ConfiguredAdapter,
    Defer,
    Done,
    EnqueueCheck,
    Failed,
    OutboxSettings,
    PerLoop,
    Reread,
    Retry,
    StopReason,
    action_event,
)
from outbox_core.steps import Query, Steps, arun, run

from . import markers
from .content import Content, check_fits, compose
from .domain import FilingState, file_key, queries, sources
from .settings import IssuesSettings
from .tracker import (
    Found,
    GraphQLRefused,
    Issue,
    NotSent,
    RateLimited,
    Refused,
    TrackerError,
    said,
)

if TYPE_CHECKING:
    from .tracker import GitHubTracker

FILE_ISSUE = "FILE_ISSUE"
PUBLISH_REPORT = "PUBLISH_REPORT"
CLEANUP_ISSUE = "CLEANUP_ISSUE"
TRANSFER_ISSUE = "TRANSFER_ISSUE"
KINDS = (FILE_ISSUE, PUBLISH_REPORT, CLEANUP_ISSUE, TRANSFER_ISSUE)

NOT_FILED = "NOT_FILED"
REPORT_ERASED = "REPORT_ERASED"
UNKNOWN_REPORT = "UNKNOWN_REPORT"
GRAPHQL_REASONS = {
    "NOT_FOUND": "GRAPHQL_NOT_FOUND",
    "FORBIDDEN": "GRAPHQL_FORBIDDEN",
}
GRAPHQL_ERROR = "GRAPHQL_ERROR"
CONTENT_REFUSED = "CONTENT_REFUSED"
"""GitHub refused what was written (422 on the title, the body): nothing was written. A
filing stopped so can be filed again by ``edit_report`` with content that fits."""
_CONTENT_FIELDS = frozenset({"title", "body", "data"})  # "data": an issue comment's body
REFUSED_STATUSES = (*range(300, 400), *range(400, 500))
DELETED, SCRUBBED = "#deleted", "#scrubbed"


NO_FILING = "no filing of this report"


def listing_lag(wait: timedelta) -> Reread:
    """A write that may still be missing from listings: looked for again once it shows."""
    return Reread(
        after=wait,
        detail=f"listing lag: a write this recent may not be listed yet, again in "
        f"{wait.total_seconds():.0f} s",
    )


def in_history(url: str) -> str:
    """What a scrub leaves published: the issue's earlier bodies in GitHub's edit history."""
    return (
        f"earlier versions of {url} in GitHub's edit history (readable by anyone who can read "
        "the issue; GitHub has no API to remove a revision: remove them in its web UI, or ask "
        "GitHub Support)"
    )


def refused_reason(status: int) -> str:
    """The stop reason of a refusal: ``GITHUB_422``."""
    return f"GITHUB_{status}"


STOP_REASONS = frozenset(
    {refused_reason(code) for code in REFUSED_STATUSES}
    | set(GRAPHQL_REASONS.values())
    | {GRAPHQL_ERROR, CONTENT_REFUSED, NOT_FILED, REPORT_ERASED, UNKNOWN_REPORT}
)


def refused_content(error: Refused) -> list[str]:
    """What of the content sent a 422 refuses (``body:custom``, ``title:missing_field``);
    empty for any other refusal."""
    if error.status != 422:
        return []
    return [
        f"{found.get('field')}:{found.get('code')}"
        for found in error.errors
        if isinstance(found, dict) and found.get("field") in _CONTENT_FIELDS
    ]


def _content_detail(error: Refused, fields: list[str]) -> str:
    """``HTTP 422 Validation Failed: body:custom (body is too long (maximum is … characters))``:
    the fields and GitHub's first words about them, never the content."""
    words = next(
        (
            said(str(found["message"]))
            for found in error.errors
            if isinstance(found, dict) and found.get("message")
        ),
        "",
    )
    return f"{error.detail}: {', '.join(fields)}" + (f" ({words})" if words else "")


def result_for(error: TrackerError, *, may_have_written: bool) -> AdapterResult:
    """The result a tracker failure proves (the table in this module's docstring), with the
    failure's detail (``TrackerError.detail``: the HTTP status and the tracker's words).

    ``may_have_written``: this attempt sent a write, or an earlier attempt may have (then a
    Retry, which clears the fence, would let the next attempt write without reading back)."""
    detail = error.detail
    match error:
        case RateLimited(wait_seconds=wait):
            return Defer(timedelta(seconds=wait), detail=f"{detail}, waiting {wait:g} s")
        case Refused(status=status) if status is not None:
            fields = refused_content(error)
            if fields:
                return Failed(CONTENT_REFUSED, detail=_content_detail(error, fields))
            return Failed(refused_reason(status), detail=detail)
        case GraphQLRefused(types=types):
            for kind in types:
                if kind in GRAPHQL_REASONS:
                    return Failed(GRAPHQL_REASONS[kind], detail=detail)
            return Failed(GRAPHQL_ERROR, detail=detail)
    # NotSent, Unanswered and any other failure.
    return Reread(detail=detail) if may_have_written else Retry(detail=detail)


class ReportPayload(BaseModel):
    """``CLEANUP_ISSUE`` and ``TRANSFER_ISSUE``: the report; the adapter reads the rest."""

    model_config = ConfigDict(extra="forbid")
    report: str = Field(min_length=1)


class GenerationPayload(ReportPayload):
    """``FILE_ISSUE`` and ``PUBLISH_REPORT``: the report and the generation to carry."""

    generation: int = Field(ge=1)


def report_of(action_key: str) -> tuple[str, int | None]:
    """(report, generation) from an idempotency key ``<prefix>:<report>[:<generation>]``.
    ``ended`` reads it there: an ended action keeps no payload."""
    parts = action_key.split(":")
    generation = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
    return parts[1], generation


def issue_location(url: str) -> tuple[str, int]:
    """(``owner/name``, number) from an issue's URL, on GitHub or a GitHub Enterprise host."""
    path = [part for part in urlsplit(url).path.split("/") if part]
    if len(path) < 4 or path[-2] not in ("issues", "pull"):
        raise ValueError(f"{url!r} is not an issue URL")
    return f"{path[-4]}/{path[-3]}", int(path[-1])


@dataclass(frozen=True, slots=True)
class Facts:
    """The filing and the report as one attempt read them (under its lease)."""

    state: FilingState
    generation: int
    workspace_id: str
    repository: str | None
    issue_number: int | None
    issue_url: str | None
    issue_node_id: str | None
    last_write_at: datetime | None
    draft_generation: int | None
    draft_title: str | None
    draft_body: str | None
    private: bool
    erased: bool
    created_at: datetime
    report_exists: bool
    title: str | None
    text: str | None
    report_generation: int | None
    now: datetime
    delete_refused: str | None = None
    """Why the tracker refused to delete the issue (the cleanup scrubs it instead)."""

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Facts:
        values = list(row)
        values[0] = FilingState(values[0])
        values[12] = values[12] is not None
        return cls(*values)


def content_of(
    report_id: str, facts: Facts, generation: int, labels: list[str], extra_keys: tuple[str, ...]
) -> Content:
    """The issue of ``generation`` from what the attempt read (:func:`content.compose`): the
    draft's answer when one was kept for that generation."""
    assert facts.title is not None and facts.text is not None
    drafted = facts.draft_generation == generation and facts.draft_body is not None
    draft = (facts.draft_title, facts.draft_body or "") if drafted else None
    return compose(report_id, facts.title, facts.text, generation, labels, extra_keys, draft=draft)


_httpx_loaded = False


def _load_httpx() -> None:
    """httpx, imported when an adapter is built, not when the plugin is loaded."""
    global _httpx_loaded
    if not _httpx_loaded:
        import httpx  # noqa: F401

        _httpx_loaded = True


class TrackerAdapter(ConfiguredAdapter[IssuesSettings]):
    """What the four issue kinds share: settings, one tracker client per event loop, the
    writer's login, the reads and writes of the filing under the attempt's lease."""

    kind: ClassVar[str] = "TRACKER_BASE"
    at_most_once = False
    instance_level = False
    default_max_attempts = 8
    retry_base = timedelta(seconds=15)
    retry_cap = timedelta(minutes=30)
    stop_reasons = STOP_REASONS
    event_prefix: ClassVar[str] = "issues"
    """The first part of this kind's log events' names (``issues.tracker.refused``)."""
    # One request: its connect, then its read and write.
    provider_timeout_settings = ("connect_timeout_seconds", "request_timeout_seconds")

    def __init__(
        self,
        settings: IssuesSettings | None = None,
        *,
        schema: str = "outbox",
        fence_margin_seconds: float = 60.0,
    ) -> None:
        super().__init__(settings, schema=schema, fence_margin_seconds=fence_margin_seconds)
        self.queries = queries(schema)
        self.max_concurrency = self.settings.max_concurrency
        self._client = PerLoop(self._open_tracker, _close_tracker)

    @classmethod
    def bind(cls, settings: IssuesSettings | None = None, **values: Any) -> type[Self]:
        """This adapter class bound to ``settings`` instead of the environment (given by
        position or by name)."""
        return super().bind(settings=settings, **values)

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        _load_httpx()
        return super().build(settings)

    def tracker(self) -> GitHubTracker:
        """The client of the running event loop (made on first use)."""
        return self._client.get()

    def _open_tracker(self) -> GitHubTracker:
        from .tracker import GitHubTracker

        settings = self.settings
        return GitHubTracker(
            settings.api_url,
            settings.token,
            identity=settings.configured_writer,
            graphql_url=settings.effective_graphql_url,
            connect_timeout=settings.connect_timeout_seconds,
            timeout=settings.request_timeout_seconds,
            max_connections=settings.max_concurrency,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- shared steps --------------------------------------------------------------------------

    def missing_settings(self, attempt: ActionAttempt, *, private: bool = False) -> Failed | None:
        missing = [
            name
            for name, value in (
                ("OUTBOX_ISSUES_TOKEN", self.settings.token),
                ("OUTBOX_ISSUES_REPOSITORY", self.settings.repository),
                *(
                    [("OUTBOX_ISSUES_PRIVATE_REPOSITORY", self.settings.private_repository)]
                    if private
                    else []
                ),
            )
            if value is None
        ]
        if not missing:
            return None
        self.event("issues.not_configured", attempt, logging.ERROR, missing=",".join(missing))
        return Failed(
            StopReason.NOT_CONFIGURED, detail=f"not configured: {', '.join(missing)} unset"
        )

    async def read(self, attempt: ActionAttempt, report_id: str) -> Facts | None:
        """The filing and the report, under the attempt's lease."""
        async with attempt.transaction() as conn:
            return await self._read(conn, report_id)

    async def _read(self, conn: AsyncConnection[Any], report_id: str) -> Facts | None:
        cursor = await conn.execute(self.queries["read_for_write"], {"report": report_id})
        row = await cursor.fetchone()
        return None if row is None else Facts.from_row(row)

    def since(self, attempt: ActionAttempt, facts: Facts) -> datetime:
        """Where a marker search starts: the action's (or the filing's) first write, minus the
        clock skew margin (the tracker's clock is not the database's)."""
        first = attempt.action.write_started_at or facts.last_write_at or facts.created_at
        return first - timedelta(seconds=self.settings.clock_skew_seconds)

    def too_soon(self, attempt: ActionAttempt, facts: Facts) -> timedelta | None:
        """How much longer a write may stay missing from listings (None: long enough)."""
        latest = max(
            (t for t in (attempt.action.write_started_at, facts.last_write_at) if t is not None),
            default=None,
        )
        if latest is None:
            return None
        left = latest + timedelta(seconds=self.settings.listing_lag_seconds) - facts.now
        return left if left > timedelta(0) else None

    def result_of(self, attempt: ActionAttempt, error: TrackerError, wrote: bool) -> AdapterResult:
        """The result a tracker failure proves for this kind (:func:`result_for`; an earlier
        attempt's write counts as this one's)."""
        return result_for(error, may_have_written=wrote or attempt.write_started)

    def failure(
        self, attempt: ActionAttempt, error: TrackerError, *, wrote: bool = False
    ) -> AdapterResult:
        """The failure's result (:meth:`result_of`), logged as
        ``<event_prefix>.tracker.<failure>``."""
        result = self.result_of(attempt, error, wrote)
        level = logging.WARNING if isinstance(result, Failed) else logging.INFO
        self.event(
            f"{self.event_prefix}.tracker." + type(error).__name__.lower(),
            attempt,
            level,
            status=error.status,
            result=type(result).__name__,
            # The tracker's own words (never a body we sent): "Bad credentials", "Resource not
            # accessible by integration".
            error=str(error)[:300],
        )
        if isinstance(result, Failed) and result.reason == CONTENT_REFUSED:
            # Checked at enqueue, refused all the same (a limit this package does not know,
            # a server of its own): nothing was written, and someone must shorten it.
            self.event(
                f"{self.event_prefix}.content_refused",
                attempt,
                logging.ERROR,
                fields=",".join(refused_content(cast(Refused, error))),
            )
        return result

    async def find_filed(
        self, attempt: ActionAttempt, report_id: str, facts: Facts, repositories: list[str]
    ) -> tuple[Issue | None, bool]:
        """The issue that ``FILE_ISSUE`` filed for this report, looked for by its marker in
        ``repositories``; and whether every listing was complete."""
        marker = markers.action_marker(file_key(report_id, 1))
        complete = True
        for repository in repositories:
            found = await self.tracker().find_issue(
                repository,
                marker,
                since=self.since(attempt, facts),
                max_pages=self.settings.max_pages,
            )
            self.foreign_markers(attempt, found, "issues")
            if found.item is not None:
                return found.item, True
            complete = complete and found.complete
        return None, complete

    def incomplete(self) -> Reread:
        """A listing longer than ``max_pages``: absence proves nothing, read again."""
        return Reread(detail=f"listing incomplete: more than {self.settings.max_pages} pages")

    def shortened(self, attempt: ActionAttempt, content: Content) -> None:
        """Say when the draft's answer was shortened to fit GitHub's limit (``draft_cut``)."""
        if content.draft_cut:
            self.event("issues.draft_shortened", attempt, logging.INFO, cut=content.draft_cut)

    def foreign_markers(self, attempt: ActionAttempt, found: Found[Any], where: str) -> None:
        """Count what a read-back by marker ignored because someone other than the token's
        identity wrote it (``readback.foreign_marker``): a marker is predictable, and anyone
        who can comment can plant one, so only the token's own writes are taken for ours."""
        for author, ref in found.foreign:
            self.event(
                "readback.foreign_marker",
                attempt,
                logging.WARNING,
                author=author,
                ref=ref,
                where=where,
            )

    async def locate(
        self, conn: AsyncConnection[Any], query: str, report_id: str, url: str
    ) -> None:
        """Keep where the issue is now (its URL, repository and number) on the filing."""
        repository, number = issue_location(url)
        await conn.execute(
            self.queries[query],
            {"report": report_id, "repository": repository, "number": number, "url": url},
        )

    def event(self, name: str, attempt: ActionAttempt, level: int, **fields: Any) -> None:
        action_event(name, attempt.id, attempt.kind, level=level, **fields)

    def ended_event(self, name: str, action: Action, **fields: Any) -> None:
        action_event(name, action.id, action.kind, level=logging.INFO, **fields)


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
        facts = await self.read(attempt, report_id)
        if facts is None:
            return Failed(UNKNOWN_REPORT, detail=NO_FILING)
        if facts.issue_number is None or facts.repository is None:
            return Failed(NOT_FILED, detail=f"the filing is {facts.state}: no issue yet")
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
            issue = await tracker.get_issue(facts.repository, facts.issue_number)
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
        facts = await self.read(attempt, report_id)
        if facts is None:
            return Failed(UNKNOWN_REPORT, detail=NO_FILING)
        if facts.issue_number is None or facts.repository is None:
            return Failed(NOT_FILED, detail=f"the filing is {facts.state}: no issue yet")
        if facts.repository == target and facts.issue_url is not None:
            return Done(facts.issue_url)
        tracker = self.tracker()
        try:
            node_id = facts.issue_node_id
            if node_id is None:
                node_id = (await tracker.get_issue(facts.repository, facts.issue_number)).node_id
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


ADAPTERS: tuple[type[TrackerAdapter], ...] = (
    FileIssueAdapter,
    PublishReportAdapter,
    CleanupIssueAdapter,
    TransferIssueAdapter,
)


def bind_all(settings: IssuesSettings) -> list[type[TrackerAdapter]]:
    """The four adapter classes bound to ``settings``."""
    return [adapter.bind(settings) for adapter in ADAPTERS]


async def _close_tracker(tracker: GitHubTracker) -> None:
    await tracker.aclose()
