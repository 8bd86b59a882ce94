"""What the four issue kinds share: their names, payloads, the filing and report as an
attempt reads them (:class:`Facts`), and :class:`TrackerAdapter` (settings, one tracker client
per event loop, the shared steps of the read-backs, the failure's result and its log event)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast
from urllib.parse import urlsplit

from psycopg import AsyncConnection
from pydantic import BaseModel, ConfigDict, Field

from outbox_core import (
    Action,
    ActionAttempt,
    AdapterResult,
    ConfiguredAdapter,
    Failed,
    OutboxSettings,
    PerLoop,
    Reread,
    StopReason,
    action_event,
)

from . import markers
from .content import Content, compose
from .domain import FilingState, file_key, queries
from .settings import IssuesSettings
from .tracker import (
    Found,
    Issue,
    Refused,
    TrackerError,
)
from .tracker_results import (
    CONTENT_REFUSED,
    NO_FILING,
    NOT_FILED,
    STOP_REASONS,
    UNKNOWN_REPORT,
    refused_content,
    result_for,
)

if TYPE_CHECKING:
    from .tracker import GitHubTracker

FILE_ISSUE = "FILE_ISSUE"
PUBLISH_REPORT = "PUBLISH_REPORT"
CLEANUP_ISSUE = "CLEANUP_ISSUE"
TRANSFER_ISSUE = "TRANSFER_ISSUE"
KINDS = (FILE_ISSUE, PUBLISH_REPORT, CLEANUP_ISSUE, TRANSFER_ISSUE)


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

    async def read_filed(
        self, attempt: ActionAttempt, report_id: str
    ) -> tuple[Facts, str, int] | Failed:
        """The facts of a report whose issue is filed, with the issue's repository and number,
        or the Failed that says why there is no issue to work on (no filing, or none filed
        yet): what a publish and a transfer need."""
        facts = await self.read(attempt, report_id)
        if facts is None:
            return Failed(UNKNOWN_REPORT, detail=NO_FILING)
        if facts.issue_number is None or facts.repository is None:
            return Failed(NOT_FILED, detail=f"the filing is {facts.state}: no issue yet")
        return facts, facts.repository, facts.issue_number

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


async def _close_tracker(tracker: GitHubTracker) -> None:
    await tracker.aclose()
