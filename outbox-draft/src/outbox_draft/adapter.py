"""The adapter of ``DRAFT_REPORT``: one model call per attempt (through
:class:`~outbox_draft.gateway.ModelGateway`), its answer kept on the report's filing under the
attempt's lease.

**The draft writes nothing outside the database**, so it calls no fence and reads nothing
back: a repeated call costs only tokens (``writes_outside = False``; the core's conformance
suite checks it in that profile). It is not at most once, not instance-level, and has no
subject (an erasure of the reporter reaches the report through outbox-issues' catalog).

Each attempt: in ``attempt.transaction()``, ``DRAFT_CLAIMED`` (the filing enters its drafting
state), the report's text read, and with ``max_in_flight_total`` a slot of the cross-replica
limit taken (none free: ``Defer``); then the call, outside any transaction; then, in
``attempt.transaction()`` again, the answer kept on the filing, which commits only while the
lease is this attempt's (another claim took it over: ``Abandoned``, nothing kept).

==================================================================  ===========================
what happened                                                       result
==================================================================  ===========================
an answer with text                                                 kept, then Done
                                                                    (``readback_ref`` = the
                                                                    completion's id)
the proxy refused for its own capacity, a 429 or 503 in a wording   Defer (its Retry-After, the
of the capacity table (:data:`outbox_draft.capacity.CAPACITY`:      "try again in N s" of its
LiteLLM's parallel slots, router and key limiter, Ollama's queue),  message, else
or the cross-replica limit is full                                  ``capacity_wait_seconds``)
                                                                    and DRAFT_DEFERRED: the
                                                                    filing DRAFT_WAITING, no
                                                                    attempt spent
a timeout, a refused or dropped connection, a 5xx, 408, 409, an     Retry (FAILED,
upstream provider's rate limit (any other 429 or 503), an answer    ATTEMPTS_EXHAUSTED at the
without text or not a chat completion                               last attempt)
404 (``model_not_found``, or no such endpoint), 400 naming the      Failed, NOT_CONFIGURED
model, 401, 403, 429 ``insufficient_quota`` (and OpenAI's billing
codes, LiteLLM's budget), a redirect; the settings lack the base
URL or the model
400 ``context_length_exceeded`` (OpenAI), LiteLLM's                 Failed,
``ContextWindowExceededError``, vLLM's "maximum context length":    CONTEXT_LENGTH_EXCEEDED
the report and the answer do not fit the model's context
any other 4xx                                                       Failed, REFUSED
the report is unknown / erased / at another generation              Failed UNKNOWN_REPORT /
                                                                    Cancelled REPORT_ERASED,
                                                                    SUPERSEDED
another claim took the lease before the answer was kept             Abandoned (nothing kept)
==================================================================  ===========================

Every Defer, Retry and Failed carries a detail (the action's ``last_detail``): the status, the
provider's code and a reason in this package's words (``"LiteLLM 429 max_parallel_requests
(the proxy's capacity); again in 15 s"``, ``"HTTP 404 model_not_found: the proxy serves no such
model or endpoint"``, ``"not configured: OUTBOX_DRAFT_MODEL unset"``), never the provider's
message, which may quote what was sent, and never the report's text.

A report that cannot fit the model's configured ``context_tokens`` is refused at enqueue
(:meth:`DraftReportAdapter.check_enqueue`, the hook's :func:`~outbox_draft.check_draftable`),
so it never costs a call; the model's own refusal is the stop reason above, after one call.

The ``ended`` hook moves the filing to ``ANSWERED`` (outbox-issues' ``draft_ended``) however the
draft ended, with the kept answer only when it is ``DONE`` (otherwise an answer kept by an
earlier attempt of it is dropped: the issue is filed with the report's own text). The
``rescheduled`` hook applies ``DRAFT_DEFERRED`` after a ``Defer``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
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
    ConfiguredAdapter,
    Defer,
    Done,
    EnqueueCheck,
    Failed,
    LeaseLost,
    PerLoop,
    Retry,
    StopReason,
    action_event,
    package_queries,
)
from outbox_core.http_results import http_result
from outbox_issues import domain
from outbox_issues.adapter import REPORT_ERASED, UNKNOWN_REPORT, Facts

from .draftable import check_draftable
from .gateway import (
    ContextExceeded,
    ModelError,
    ModelGateway,
    ModelRefused,
    ProxyBusy,
    Report,
)
from .settings import DraftSettings

DRAFT_REPORT = "DRAFT_REPORT"
DRAFT_DEFERRED = "DRAFT_DEFERRED"
"""The domain event of a deferred draft (``Defer.event``): the filing enters DRAFT_WAITING."""
SUPERSEDED = "SUPERSEDED"
"""The report is at another generation than the draft's: nothing to draft any more."""
CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"
"""The model refused the request as longer than its context (the report and the answer): no
retry cures it, the report is filed with its own text."""
STOP_REASONS = frozenset({REPORT_ERASED, UNKNOWN_REPORT, SUPERSEDED, CONTEXT_LENGTH_EXCEEDED})
SLOT_HOLD_MARGIN_SECONDS = 30.0
"""A slot of the cross-replica limit is held this long past the call's own timeout."""


class DraftPayload(BaseModel):
    """The report and the generation to draft; the adapter reads the text."""

    model_config = ConfigDict(extra="forbid")
    report: str = Field(min_length=1)
    generation: int = Field(ge=1)


def report_of(action: Action) -> tuple[str, int | None]:
    """(report, generation) of a draft: from its payload while it has one, else from its key
    ``draft:<report>:<generation>`` (an ended action keeps no payload)."""
    payload = action.payload
    if isinstance(payload, dict) and isinstance(payload.get("report"), str):
        generation = payload.get("generation")
        return payload["report"], generation if isinstance(generation, int) else None
    parts = action.idempotency_key.split(":")
    generation_part = parts[2] if len(parts) > 2 else ""
    report = parts[1] if len(parts) > 1 else ""
    return report, int(generation_part) if generation_part.isdigit() else None


QUOTE_RUN = 16
"""A run of this many characters of the report in the proxy's message keeps the message out of
the log."""
QUOTED = "(the proxy's message is left out: it quotes the request)"


def quotes(message: str, text: str) -> bool:
    """Whether ``message`` repeats a run of :data:`QUOTE_RUN` characters of ``text``."""
    return any(
        message[start : start + QUOTE_RUN] in text for start in range(len(message) - QUOTE_RUN + 1)
    )


def again_in(wait: timedelta) -> str:
    """A deferral's wait as its detail says it."""
    return f"again in {wait.total_seconds():g} s"


def result_for(error: ModelError, settings: DraftSettings) -> AdapterResult:
    """The result a failed call proves (the table in this module's docstring), with the
    failure's detail (its status, code and reason; never the provider's message)."""
    match error:
        case ProxyBusy(wait=wait):
            after = wait if wait is not None else timedelta(seconds=settings.capacity_wait_seconds)
            return Defer(after, DRAFT_DEFERRED, detail=f"{error.detail}; {again_in(after)}")
        case ModelRefused():
            return Failed(StopReason.NOT_CONFIGURED, detail=error.detail)
        case ContextExceeded():
            return Failed(CONTEXT_LENGTH_EXCEEDED, detail=error.detail)
    # UpstreamFailed (Retry after its Retry-After), RequestRefused (Failed REFUSED) and any
    # other failure (Retry): the core's mapping. The draft writes nothing outside the
    # database, so no failure of it may have written.
    return http_result(error.failure)


class DraftReportAdapter(ConfiguredAdapter[DraftSettings]):
    """``DRAFT_REPORT``: one model call, no tools, its answer kept on the filing under the
    lease. It writes nothing outside the database: no fence, no read-back, a repeated call
    costs only tokens."""

    kind: ClassVar[str] = DRAFT_REPORT
    at_most_once = False
    instance_level = False
    writes_outside = False
    default_max_attempts = 3
    retry_base = timedelta(seconds=10)
    retry_cap = timedelta(minutes=2)
    stop_reasons = STOP_REASONS
    # One call: its connect, then its request (the model's answer).
    provider_timeout_settings = ("connect_timeout_seconds", "request_timeout_seconds")

    def __init__(
        self,
        settings: DraftSettings | None = None,
        *,
        schema: str = "outbox",
        fence_margin_seconds: float = 60.0,
    ) -> None:
        super().__init__(settings, schema=schema, fence_margin_seconds=fence_margin_seconds)
        # Calls in flight per executor: the core's per-kind slot limit, no second counter.
        self.max_concurrency = self.settings.max_concurrency
        self.queries = package_queries("outbox_draft", "sql/queries.sql", schema)
        self._issues = domain.queries(schema)
        self._gateway = PerLoop(self._open_gateway, _close_gateway)

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(DraftPayload)

    # -- at enqueue ----------------------------------------------------------------------------

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        """A report whose text cannot be drafted (:func:`~outbox_draft.check_draftable`: longer
        than ``max_report_chars``, or than the model's ``context_tokens`` allow) is refused on
        every enqueue path, nothing written. The text is the stored one of the payload's
        generation: none yet while ``submit_report`` and ``edit_report`` check before they
        store it, and their draft hook has checked the text it was handed then."""
        payload = cast(DraftPayload, check.body)
        queries = package_queries("outbox_draft", "sql/queries.sql", check.schema)
        params = {"report": payload.report, "generation": payload.generation}
        row = conn.execute(queries["report_text"], params).fetchone()
        if row is not None:
            check_draftable(row[0], cls.section_settings())

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        """The async twin of :meth:`check_enqueue`."""
        payload = cast(DraftPayload, check.body)
        queries = package_queries("outbox_draft", "sql/queries.sql", check.schema)
        params = {"report": payload.report, "generation": payload.generation}
        cursor = await conn.execute(queries["report_text"], params)
        row = await cursor.fetchone()
        if row is not None:
            check_draftable(row[0], cls.section_settings())

    def gateway(self) -> ModelGateway:
        """The running event loop's gateway (made on first use)."""
        return self._gateway.get()

    def _open_gateway(self) -> ModelGateway:
        return ModelGateway(self.settings)

    async def aclose(self) -> None:
        await self._gateway.aclose()

    # -- one attempt -----------------------------------------------------------------------------

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        settings = self.settings
        if settings.missing:
            missing = ",".join(settings.missing)
            self.event("draft.not_configured", attempt, logging.ERROR, missing=missing)
            return Failed(
                StopReason.NOT_CONFIGURED,
                detail=f"not configured: {', '.join(settings.missing)} unset",
            )
        payload = cast(DraftPayload, attempt.body)
        try:
            async with attempt.transaction() as conn:
                facts = await self._facts(conn, payload.report)
                refusal = self._refusal(facts, payload.generation)
                if refusal is not None:
                    return refusal
                assert facts is not None and facts.text is not None
                text = facts.text
                await domain.draft_claimed(conn, self.schema, payload.report)
                if not await self._take_slot(conn, attempt):
                    self.event("draft.deferred", attempt, logging.INFO, why="limit_full")
                    after = timedelta(seconds=settings.capacity_wait_seconds)
                    limit = (
                        f"{settings.variable('max_in_flight_total')}={settings.max_in_flight_total}"
                    )
                    return Defer(
                        after,
                        DRAFT_DEFERRED,
                        detail=f"limit full: {limit} calls in flight; {again_in(after)}",
                    )
        except LeaseLost:
            return Abandoned()
        try:
            answer = await self.gateway().draft(Report(payload.report, payload.generation, text))
        except ModelError as error:
            await self._release(attempt)
            return self.failure(attempt, error, text)
        title, body = answer.title_and_body(settings.max_answer_chars)
        try:
            async with attempt.transaction() as conn:
                kept = await domain.keep_answer(
                    conn, self.schema, payload.report, payload.generation, title=title, body=body
                )
                await self._free_slot(conn, attempt)
                if not kept:
                    refusal = self._refusal(
                        await self._facts(conn, payload.report), payload.generation
                    )
                    return refusal if refusal is not None else Cancelled(SUPERSEDED)
        except LeaseLost:
            # Another claim took the action after the call: its attempt keeps its own answer.
            self.event("draft.lease_lost", attempt, logging.WARNING)
            return Abandoned()
        usage = answer.usage
        self.event(
            "draft.kept",
            attempt,
            logging.INFO,
            finish_reason=answer.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
        )
        return Done(answer.completion_id)

    async def _facts(self, conn: AsyncConnection[Any], report_id: str) -> Facts | None:
        cursor = await conn.execute(self._issues["read_for_write"], {"report": report_id})
        row = await cursor.fetchone()
        return None if row is None else Facts.from_row(row)

    @staticmethod
    def _refusal(facts: Facts | None, generation: int) -> AdapterResult | None:
        """Why this draft has nothing to do: the report unknown, erased, or at another
        generation. None: draft it."""
        if facts is None:
            return Failed(UNKNOWN_REPORT)
        if not facts.report_exists or facts.erased or facts.text is None:
            return Cancelled(REPORT_ERASED)
        if facts.report_generation != generation:
            return Cancelled(SUPERSEDED)
        return None

    def failure(self, attempt: ActionAttempt, error: ModelError, text: str) -> AdapterResult:
        """The result of a failed call, logged with its detail and the proxy's own words,
        unless those quote the report (a server's validation error may repeat the request)."""
        result = result_for(error, self.settings)
        level = logging.ERROR if isinstance(result, Failed) else logging.INFO
        words = str(error)[:300]
        self.event(
            "draft.model." + type(error).__name__.lower(),
            attempt,
            level,
            status=error.status,
            code=error.code,
            result=type(result).__name__,
            detail=error.detail,
            error=QUOTED if quotes(words, text) else words,
        )
        return result

    # -- the cross-replica limit -----------------------------------------------------------------

    async def _take_slot(self, conn: AsyncConnection[Any], attempt: ActionAttempt) -> bool:
        limit = self.settings.max_in_flight_total
        if limit is None:
            return True
        await conn.execute(self.queries["add_slots"], {"limit": limit})
        hold = float(self.provider_timeout_seconds or 0.0) + SLOT_HOLD_MARGIN_SECONDS
        cursor = await conn.execute(
            self.queries["take_slot"],
            {"limit": limit, "action": attempt.id, "epoch": attempt.epoch, "hold": hold},
        )
        return await cursor.fetchone() is not None

    async def _free_slot(self, conn: AsyncConnection[Any], attempt: ActionAttempt) -> None:
        if self.settings.max_in_flight_total is not None:
            await conn.execute(
                self.queries["release_slot"], {"action": attempt.id, "epoch": attempt.epoch}
            )

    async def _release(self, attempt: ActionAttempt) -> None:
        """Free the slot after a failed call (a lost lease leaves it to run out)."""
        if self.settings.max_in_flight_total is None:
            return
        try:
            async with attempt.transaction() as conn:
                await self._free_slot(conn, attempt)
        except LeaseLost:
            pass

    # -- the domain events -----------------------------------------------------------------------

    async def rescheduled(
        self, conn: AsyncConnection[Any], action: Action, result: Retry | Defer
    ) -> None:
        if isinstance(result, Defer):
            report_id, _ = report_of(action)
            await domain.draft_deferred(conn, self.schema, report_id)

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        report_id, generation = report_of(action)
        if action.state is not ActionState.DONE and generation is not None:
            await domain.drop_answer(conn, self.schema, report_id, generation)
        await domain.draft_ended(conn, self.schema, report_id)

    def event(self, name: str, attempt: ActionAttempt, level: int, **fields: Any) -> None:
        action_event(name, attempt.id, attempt.kind, level=level, **fields)


async def _close_gateway(gateway: ModelGateway) -> None:
    await gateway.aclose()
