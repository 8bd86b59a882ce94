"""``SlackPostAdapter``: the only adapter of ``SLACK_POST`` and the only code that talks to Slack.

One attempt posts one complete message for one turn: its unredacted entries, read from the
database, with ``chat.postMessage`` (``begin_write()`` just before it), carrying Slack message
metadata ``{"event_type": "outbox_post", "event_payload": {"idempotency_key": ..., "turn_id":
..., "entries": [{"id": ..., "kind": "question"}, ...]}}``. The result follows from what Slack
provably holds:

=================================================  ============================================
what happened to the post                          result
=================================================  ============================================
``ok: true``                                       Done, ``readback_ref`` = ``<channel>:<ts>``
``ok: true`` with the warning                      Failed ``SLACK_MESSAGE_TRUNCATED`` (Slack kept
``message_truncated``                              40,000 characters); the entries get no
                                                   message reference
``ok: true`` with another warning, except          Failed ``SLACK_MESSAGE_ALTERED`` (the message
``missing_charset`` and ``superfluous_charset``    may not be as sent)
the turn's message over 40,000 characters (one     Failed ``SLACK_MSG_TOO_LONG``, not posted
enqueued before the enqueue check refused it)
connection refused, DNS, TLS handshake or connect  Retry (nothing was sent)
timeout
HTTP 429 (``Retry-After``), or ``ratelimited``     Defer for that long (the attempt does not
                                                   count; without the header
                                                   ``rate_limit_seconds``)
``channel_not_found``, ``not_in_channel``,         Failed with its stop reason
``is_archived``, ``msg_too_long``,                 (:data:`STOP_REASONS`), ``SLACK_REFUSED``
``invalid_auth``, ... (any other ``ok: false``)    for an error outside the set
``internal_error``, ``fatal_error``               Reread (Slack says some part may have
                                                   succeeded)
``service_unavailable``, ``request_timeout``,      Retry (Slack says it did not carry it out)
``team_added_to_org``
a timeout or a dropped connection after the        Reread
request was sent, HTTP 5xx, an unreadable answer
another HTTP 4xx without a Slack answer            Retry (refused before Slack took it; a wrong
                                                   base URL)
no token configured                                Failed ``NOT_CONFIGURED`` (nothing sent);
                                                   after an unknown write Uncertain
                                                   ``SLACK_HISTORY_UNREADABLE``
every entry redacted before the post               Cancelled ``SLACK_REDACTED`` (nothing sent)
=================================================  ============================================

A turn's message is refused at enqueue when Slack would cut it (:mod:`outbox_slack.message`):
:meth:`SlackPostAdapter.check_enqueue` reads the turn's stored entries on every enqueue path.

The read-back after an unknown write is :mod:`outbox_slack.readback`; the Slack clients and what
their answers mean are :mod:`outbox_slack.slack_api`.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Final, Self, cast

from psycopg import AsyncConnection, Connection
from pydantic import BaseModel, Field

from outbox_core import (
    Abandoned,
    Action,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Cancelled,
    ConfigurationError,
    ConfiguredAdapter,
    Done,
    EnqueueCheck,
    Failed,
    OutboxSettings,
    PerLoop,
    Reread,
    Retry,
    StopReason,
    Uncertain,
    event,
)
from outbox_core.http_results import HttpFailure, Proof, http_result
from outbox_core.steps import Query, Steps, arun, run

from .domain import message_ref, on_ended, queries
from .message import TEXT_LIMIT, check_length, message_text, text_length
from .readback import PostingIdentity, SlackReadBack, TurnContent
from .settings import SlackSettings
from .slack_api import (
    ALTERED_WARNINGS,
    ERROR_REASONS,
    EVENT_TYPE,
    MAYBE_WRITTEN,
    NOT_TAKEN,
    RATE_LIMITED,
    SLACK_HISTORY_UNREADABLE,
    SLACK_MESSAGE_ALTERED,
    SLACK_MSG_TOO_LONG,
    SLACK_REDACTED,
    SLACK_REFUSED,
    STOP_REASONS,
    SlackAnswer,
    SlackClients,
    answer_of,
    slack_libraries,
    warnings_of,
)

KIND: Final = "SLACK_POST"


class SlackPost(BaseModel):
    """The payload of a ``SLACK_POST``: identifiers only (the adapter reads the entries)."""

    turn_id: str = Field(min_length=1)
    entry_ids: list[str] = Field(min_length=1)


def idempotency_key(turn_id: str) -> str:
    """The key of a turn's post: ``slack_post:<turn_id>``."""
    return f"slack_post:{turn_id}"


def lane_key(channel: str, thread_ts: str | None) -> str:
    """One lane per channel (top-level posts) or per thread: ``slack:<channel>[:<thread_ts>]``."""
    return f"slack:{channel}" if thread_ts is None else f"slack:{channel}:{thread_ts}"


class SlackPostAdapter(SlackReadBack, ConfiguredAdapter[SlackSettings]):
    """Posts the ``SLACK_POST`` actions: one message per turn, read back by its metadata.

    Settings come from :class:`SlackSettings` (``OUTBOX_SLACK_*``) unless the class was bound
    to its own (:meth:`bind`, what tests and ``outbox_slack.testing.serve_slack`` use)."""

    kind = KIND
    at_most_once = False
    instance_level = False
    retained = False
    """The 30-day sweep leaves ended posts alone: they go when their entries are redacted."""
    writes_again_when_absent = False
    """After an unknown write an attempt only reads: a post it proves absent is ABSENT."""
    default_max_attempts = 10
    retry_base = timedelta(seconds=10)
    retry_cap = timedelta(minutes=15)
    stop_reasons = STOP_REASONS
    # The adapter's own bound on one provider call (aiohttp's total timeout of a request).
    provider_timeout_settings = ("request_timeout_seconds",)

    def __init__(
        self,
        settings: SlackSettings | None = None,
        *,
        schema: str = "outbox",
        fence_margin_seconds: float = 60.0,
    ) -> None:
        super().__init__(settings, schema=schema, fence_margin_seconds=fence_margin_seconds)
        window = self.settings.readback_window_seconds
        if window >= self.unreadable_for.total_seconds():
            raise ConfigurationError(
                f"{self.settings.variable('readback_window_seconds')} ({window:g}) must be below "
                f"{type(self).__qualname__}.unreadable_for "
                f"({self.unreadable_for.total_seconds():g} s): a read-back gives up as uncertain "
                "once that has passed since the post, so a complete read after the window could "
                "never prove the post absent"
            )
        # No more posts at once than connections: the others would wait for one after their
        # fence while their lease runs down.
        self.max_concurrency = self.settings.max_connections
        self.fence_margin = timedelta(seconds=fence_margin_seconds)
        self._sql = queries(schema)
        self._clients = PerLoop(self._open_clients, SlackClients.aclose)
        # Who the token posts as, asked of auth.test once (at the first read-back) and kept:
        # a read-back takes only a message of this identity for the post.
        self._identity: PostingIdentity | None = None

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(SlackPost)

    # -- at enqueue ----------------------------------------------------------------------------

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        """A turn whose message Slack would cut (over 40,000 characters) is refused
        (``InvalidRequest`` on ``entries``) on every enqueue path, nothing written: its entries,
        stored before the enqueue (``post_turn`` does), are read in the caller's transaction."""
        run(conn, _length_check_steps(check))

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        """The async twin of :meth:`check_enqueue`."""
        await arun(conn, _length_check_steps(check))

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        slack_libraries()
        adapter = super().build(settings)
        if adapter.settings.token is None:
            event(
                "slack.not_configured",
                level=logging.WARNING,
                detail="OUTBOX_SLACK_TOKEN is not set: every SLACK_POST ends FAILED with "
                "NOT_CONFIGURED",
            )
        return adapter

    async def aclose(self) -> None:
        await self._clients.aclose()

    def _open_clients(self) -> SlackClients:
        token = self.settings.token
        assert token is not None
        return SlackClients(self.settings, token.get_secret_value())

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        await on_ended(conn, self.schema, action)

    # -- one attempt ---------------------------------------------------------------------------

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        body = cast(SlackPost, attempt.body)
        if self.settings.token is None:
            if attempt.write_started:
                # An earlier attempt may have posted, and nothing can read it back now.
                self._event("slack.readback.unreadable", attempt, logging.WARNING, error="no token")
                return Uncertain(
                    SLACK_HISTORY_UNREADABLE, detail="OUTBOX_SLACK_TOKEN is not set: no read-back"
                )
            return Failed(StopReason.NOT_CONFIGURED, detail="OUTBOX_SLACK_TOKEN is not set")
        async with attempt.transaction() as conn:
            content = await self._content(conn, body.turn_id)
        if attempt.write_started:
            return await self._read_back(attempt, body.turn_id, content)
        if content is None or not content.texts:
            self._event("slack.post.nothing_to_post", attempt, logging.INFO)
            return Cancelled(SLACK_REDACTED, detail="every entry was redacted before the post")
        return await self._post(attempt, body, content)

    async def _content(self, conn: AsyncConnection[Any], turn_id: str) -> TurnContent | None:
        cursor = await conn.execute(self._sql["post_content"], {"turn_id": turn_id})
        row = await cursor.fetchone()
        return None if row is None else TurnContent(*row)

    def _metadata(self, attempt: ActionAttempt, body: SlackPost, content: TurnContent) -> Any:
        return {
            "event_type": EVENT_TYPE,
            "event_payload": {
                "idempotency_key": attempt.idempotency_key,
                "turn_id": body.turn_id,
                "entries": [
                    {"id": entry_id, "kind": kind}
                    for entry_id, kind in zip(content.entry_ids, content.entry_kinds, strict=True)
                ],
            },
        }

    async def _post(
        self, attempt: ActionAttempt, body: SlackPost, content: TurnContent
    ) -> AdapterResult:
        text = message_text(content.texts)
        length = text_length(text)
        if length > TEXT_LIMIT:
            # Enqueued before the enqueue check refused such turns: never posted cut.
            self._event("slack.post.refused", attempt, logging.WARNING, reason=SLACK_MSG_TOO_LONG)
            return Failed(
                SLACK_MSG_TOO_LONG,
                detail=f"the message is {length:,} characters, Slack keeps {TEXT_LIMIT:,}: "
                "not posted",
            )
        aiohttp, _, errors = slack_libraries()
        clients = self._clients.get()
        if not await attempt.fence().begin_write():
            return Abandoned()
        try:
            response = await clients.post.chat_postMessage(
                channel=content.channel,
                text=text,
                thread_ts=content.thread_ts,
                metadata=self._metadata(attempt, body, content),
            )
        except errors.SlackApiError as exc:
            return self._refused(attempt, answer_of(exc))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # The connection never stood (refused, DNS, TLS handshake): nothing was sent.
            self._event("slack.post.retry", attempt, logging.WARNING, error=type(exc).__name__)
            return Retry(detail=f"{type(exc).__name__} before the post was sent")
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Sent, and then no answer: Slack may hold the post.
            self._event("slack.post.unknown", attempt, logging.WARNING, error=type(exc).__name__)
            return Reread(
                after=self._window_wait(timedelta(0)),
                detail=f"{type(exc).__name__} after the post was sent",
            )
        channel = str(response.get("channel") or content.channel)
        ts = response.get("ts")
        if not isinstance(ts, str) or not ts:
            self._event("slack.post.unknown", attempt, logging.WARNING, error="no ts")
            return Reread(after=self._window_wait(timedelta(0)), detail="Slack ok without a ts")
        warnings = warnings_of(response)
        if warnings:
            # Posted, but not as sent (cut at 40,000 characters): not done, and the entries
            # get no message reference (the ending is not DONE).
            reason = next(
                (ALTERED_WARNINGS[name] for name in warnings if name in ALTERED_WARNINGS),
                SLACK_MESSAGE_ALTERED,
            )
            named = ",".join(warnings)
            self._event(
                "slack.post.altered", attempt, logging.WARNING, reason=reason, warning=named, ts=ts
            )
            return Failed(
                reason, detail=f"Slack ok with warning {named}: message {ts} is not as sent"
            )
        self._event("slack.post.done", attempt, logging.DEBUG)
        return Done(message_ref(channel, ts))

    def _refused(self, attempt: ActionAttempt, answer: SlackAnswer) -> AdapterResult:
        """The post's answer was not ``ok: true``."""
        fields = {"status": answer.status, "error": answer.error}
        detail = answer.detail()
        if answer.status == 429 or answer.error in RATE_LIMITED:
            # The HTTP-level part that every HTTP provider shares (the core's mapping: Defer
            # for the wait named, else the settings' own); Slack's 200 ``ok: false`` answers
            # below are its own.
            wait = answer.retry_after or self.settings.rate_limit_seconds
            self._event("slack.post.rate_limited", attempt, logging.INFO, wait=wait, **fields)
            limited = HttpFailure(Proof.LIMITED, detail, wait=timedelta(seconds=wait))
            return http_result(limited)
        if answer.status >= 500 or answer.error in MAYBE_WRITTEN:
            self._event("slack.post.unknown", attempt, logging.WARNING, **fields)
            return Reread(after=self._window_wait(timedelta(0)), detail=detail)
        if answer.error in NOT_TAKEN:
            self._event("slack.post.retry", attempt, logging.WARNING, **fields)
            return Retry(detail=detail)
        if answer.error is not None:
            reason = ERROR_REASONS.get(answer.error, SLACK_REFUSED)
            self._event("slack.post.refused", attempt, logging.WARNING, reason=reason, **fields)
            return Failed(reason, detail=detail)
        if answer.status == 200:
            # HTTP 200 without a Slack answer: it may have been taken.
            self._event("slack.post.unknown", attempt, logging.WARNING, **fields)
            return Reread(after=self._window_wait(timedelta(0)), detail=detail)
        self._event("slack.post.retry", attempt, logging.WARNING, **fields)
        return Retry(detail=f"{detail} (check OUTBOX_SLACK_BASE_URL)")


def _length_check_steps(check: EnqueueCheck) -> Steps[None]:
    """The enqueue check: the turn's stored entries (what the post would send) fit Slack's limit.
    A turn not stored yet has nothing to measure (its entry point checks what it stores)."""
    body = cast(SlackPost, check.body)
    rows = yield Query(queries(check.schema)["post_content"], {"turn_id": body.turn_id})
    if rows:
        check_length(body.turn_id, TurnContent(*rows[0]).texts)
