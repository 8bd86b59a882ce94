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

After an unknown write (``attempt.write_started``) the attempt only reads: it never posts. Reads
are bounded by time, not attempts (the core's read-back rule): a read-only Reread spends no
attempt, and the adapter names a wait only when it knows one (Slack's ``Retry-After``, the rest
of the read-back window); otherwise the core's wait grows from ``reread_base`` to
``reread_cap``. Every Reread's detail says what the read saw.

=================================================  ============================================
what the read-back found                           result
=================================================  ============================================
a message whose metadata names this action's key,  Done with that message's ``ts``
posted by the token's identity
such a message posted by anyone else               ignored (``readback.foreign_marker``)
``auth.test`` (asked once per adapter) fails       as a history page that fails, below
history read completely, the read begun at least   Cancelled ``ABSENT`` (never posted again)
``readback_window_seconds`` after the fence
read completely, but sooner                        Reread after the rest of the window (Slack
                                                   may show a new post late)
more pages than ``readback_pages_per_attempt``     Reread, the cursor kept on the turn's row
a page rate-limited (429, ``ratelimited``)         Reread after Slack's ``Retry-After`` (without
                                                   one, the core's wait), the cursor kept
HTTP 5xx, ``internal_error``, ``fatal_error``,     Reread (the core's growing wait), the cursor
``service_unavailable``, a timeout or a drop       kept
either of the two for ``unreadable_for`` since     UNCERTAIN ``READBACK_UNAVAILABLE`` (the core)
the fence
``missing_scope``, ``not_in_channel``,             Uncertain ``SLACK_HISTORY_UNREADABLE``
``channel_not_found``, ``invalid_auth``,
``invalid_cursor``, ``thread_not_found``, any
other ``ok: false``; ``has_more`` without a cursor
=================================================  ============================================

The token's identity is ``auth.test``'s ``user_id`` and ``bot_id``, asked at the first read-back
and kept by the adapter: a message is the post only when its ``bot_id`` is the bot's (and its
``user``, when it has one, the bot's user), or, for a token without a bot, its ``user`` is the
token's. The metadata's key is predictable (``slack_post:<turn_id>``), so anyone who can post to
the channel could otherwise plant a message that a read-back after a lost answer takes for the
post.

A turn's message is refused at enqueue when Slack would cut it (:mod:`outbox_slack.message`):
:meth:`SlackPostAdapter.check_enqueue` reads the turn's stored entries on every enqueue path.

The read covers ``oldest`` = the fence's time minus ``readback_clock_skew_seconds`` to
``latest`` = the fence's time plus the fence margin (the post ended within it) plus the skew,
with ``include_all_metadata=true``, ``conversations.history`` for a top-level post and
``conversations.replies`` for a threaded one.

slack_sdk's retry handlers never retry a post: its default handler resends a request after a
dropped connection, which for ``chat.postMessage`` would be a second message. The post client
has none; the read client keeps the default (a read sent twice is harmless).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Self, cast

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
    action_event,
    event,
    retry_after,
)
from outbox_core.http_results import HttpFailure, Proof, http_result
from outbox_core.steps import Query, Steps, arun, run

from .domain import message_ref, on_ended, queries
from .message import TEXT_LIMIT, check_length, message_text, text_length
from .settings import SlackSettings

if TYPE_CHECKING:
    from slack_sdk.web.async_client import AsyncWebClient

KIND: Final = "SLACK_POST"
EVENT_TYPE: Final = "outbox_post"
"""The ``event_type`` of the metadata on every post (Slack: a short alphanumeric name)."""

SLACK_REFUSED: Final = "SLACK_REFUSED"
SLACK_REDACTED: Final = "SLACK_REDACTED"
SLACK_HISTORY_UNREADABLE: Final = "SLACK_HISTORY_UNREADABLE"
SLACK_MSG_TOO_LONG: Final = "SLACK_MSG_TOO_LONG"
SLACK_MESSAGE_TRUNCATED: Final = "SLACK_MESSAGE_TRUNCATED"
SLACK_MESSAGE_ALTERED: Final = "SLACK_MESSAGE_ALTERED"

ERROR_REASONS: Final[Mapping[str, str]] = {
    "channel_not_found": "SLACK_CHANNEL_NOT_FOUND",
    "not_in_channel": "SLACK_NOT_IN_CHANNEL",
    "is_archived": "SLACK_IS_ARCHIVED",
    "msg_too_long": SLACK_MSG_TOO_LONG,
    "no_text": "SLACK_NO_TEXT",
    "invalid_auth": "SLACK_INVALID_AUTH",
    "not_authed": "SLACK_NOT_AUTHED",
    "account_inactive": "SLACK_ACCOUNT_INACTIVE",
    "token_revoked": "SLACK_TOKEN_REVOKED",
    "token_expired": "SLACK_TOKEN_EXPIRED",
    "missing_scope": "SLACK_MISSING_SCOPE",
    "not_allowed_token_type": "SLACK_MISSING_SCOPE",
    "restricted_action": "SLACK_RESTRICTED_ACTION",
    "restricted_action_read_only_channel": "SLACK_RESTRICTED_ACTION",
    "restricted_action_thread_only_channel": "SLACK_RESTRICTED_ACTION",
    "restricted_action_non_threadable_channel": "SLACK_RESTRICTED_ACTION",
    "cannot_reply_to_message": "SLACK_CANNOT_REPLY",
    "invalid_metadata_format": "SLACK_INVALID_METADATA",
    "invalid_metadata_schema": "SLACK_INVALID_METADATA",
    "metadata_too_large": "SLACK_INVALID_METADATA",
    "metadata_must_be_sent_from_app": "SLACK_INVALID_METADATA",
}
"""Slack's permanent ``chat.postMessage`` errors and their stop reasons (a closed set: a stop
reason is a metric label). Any other ``ok: false`` error ends ``SLACK_REFUSED``."""

STOP_REASONS: Final = frozenset(ERROR_REASONS.values()) | {
    SLACK_REFUSED,
    SLACK_REDACTED,
    SLACK_HISTORY_UNREADABLE,
    SLACK_MESSAGE_TRUNCATED,
    SLACK_MESSAGE_ALTERED,
}

MAYBE_WRITTEN: Final = frozenset({"internal_error", "fatal_error"})
"""``ok: false`` errors after which the post may exist (Slack: "it's possible some aspect of
the operation succeeded"): read back."""
NOT_TAKEN: Final = frozenset({"service_unavailable", "request_timeout", "team_added_to_org"})
"""``ok: false`` errors by which Slack says it did not carry the request out (unavailable, the
request arrived truncated, the workspace is migrating): retry."""
RATE_LIMITED: Final = frozenset({"ratelimited", "rate_limited"})
ALTERED_WARNINGS: Final[Mapping[str, str]] = {"message_truncated": SLACK_MESSAGE_TRUNCATED}
"""``ok: true`` warnings by which Slack says it posted something else than was sent (it kept
40,000 characters of the text): the post is not done."""
REQUEST_WARNINGS: Final = frozenset({"missing_charset", "superfluous_charset"})
"""``ok: true`` warnings about how the request was encoded, not about the message: ignored.
Any other warning may mean an altered message: ``SLACK_MESSAGE_ALTERED``, never done."""


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


_libs: tuple[ModuleType, ModuleType, ModuleType] | None = None


_SDK_LOGGER = logging.getLogger("outbox_slack.slack_sdk")
_SDK_LOGGER.setLevel(logging.WARNING)


def _lib() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(aiohttp, slack_sdk.web.async_client, slack_sdk.errors), imported when the adapter is
    built, never when the plugin is loaded (``outbox migrate`` stays light)."""
    global _libs
    if _libs is None:
        import aiohttp
        import slack_sdk.errors
        import slack_sdk.web.async_client

        _libs = (aiohttp, slack_sdk.web.async_client, slack_sdk.errors)
    return _libs


@dataclass(frozen=True, slots=True)
class _Content:
    channel: str
    thread_ts: str | None
    cursor: str | None
    started_at: datetime | None
    now: datetime
    entry_ids: list[str]
    entry_kinds: list[str]
    texts: list[str]


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a Slack call came back with, when it came back at all."""

    status: int
    error: str | None
    retry_after: float | None

    def detail(self) -> str:
        """A result's detail: Slack's error code (``"Slack channel_not_found"``), with the HTTP
        status when it is not 200, or the status alone; an error that does not look like one
        of Slack's codes is not kept (a proxy's page, say)."""
        if self.error is not None and _SLACK_CODE.fullmatch(self.error):
            if self.status in (0, 200):
                return f"Slack {self.error}" if self.status else self.error
            return f"Slack {self.error} (HTTP {self.status})"
        return f"HTTP {self.status} without a Slack answer"


# Slack's error codes ("channel_not_found"), and the exception names of failed calls.
_SLACK_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,63}")


@dataclass(frozen=True, slots=True)
class _Identity:
    """Who the token posts as (``auth.test``): the bot's user id and its bot id."""

    user_id: str | None
    bot_id: str | None

    def wrote(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` was posted by this identity. A bot's message carries its
        ``bot_id`` (and its bot user as ``user``); a token without a bot posts as its user."""
        user = message.get("user")
        if self.bot_id is not None:
            if message.get("bot_id") != self.bot_id:
                return False
            return user is None or self.user_id is None or user == self.user_id
        return user is not None and user == self.user_id

    @staticmethod
    def author(message: Mapping[str, Any]) -> str:
        """Who posted ``message``, for the log: its bot id, else its user id."""
        author = message.get("bot_id") or message.get("user")
        return str(author) if isinstance(author, str) and _SLACK_CODE.fullmatch(author) else "?"


class _Clients:
    """One aiohttp session and two Web API clients on it, in one event loop."""

    def __init__(self, settings: SlackSettings, token: str) -> None:
        aiohttp, async_client, _ = _lib()
        self.loop = asyncio.get_running_loop()
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=settings.request_timeout_seconds,
                sock_connect=settings.connect_timeout_seconds,
            ),
            connector=aiohttp.TCPConnector(limit=settings.max_connections),
        )
        common: dict[str, Any] = {
            "token": token,
            "base_url": settings.base_url,
            "session": self.session,
            "timeout": int(settings.request_timeout_seconds),
            # slack_sdk logs every request and answer in full at DEBUG (the message's text, the
            # metadata's turn and entries): its clients log to a logger that lets warnings
            # through only, so an executor run at DEBUG never writes a post's content.
            "logger": _SDK_LOGGER,
        }
        # No retry handler on the post client: a post resent after a dropped connection is a
        # second message (tests/test_post.py::test_a_post_is_never_resent_by_slack_sdk).
        self.post: AsyncWebClient = async_client.AsyncWebClient(retry_handlers=[], **common)
        self.read: AsyncWebClient = async_client.AsyncWebClient(**common)
        # Read-backs that start together ask auth.test once (the adapter keeps the answer).
        self.identity_lock = asyncio.Lock()

    async def aclose(self) -> None:
        await self.session.close()


class SlackPostAdapter(ConfiguredAdapter[SlackSettings]):
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
        self._clients = PerLoop(self._open_clients, _Clients.aclose)
        # Who the token posts as, asked of auth.test once (at the first read-back) and kept:
        # a read-back takes only a message of this identity for the post.
        self._identity: _Identity | None = None

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
        _lib()
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

    def _open_clients(self) -> _Clients:
        token = self.settings.token
        assert token is not None
        return _Clients(self.settings, token.get_secret_value())

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
            return await self._read_back(attempt, body, content)
        if content is None or not content.texts:
            self._event("slack.post.nothing_to_post", attempt, logging.INFO)
            return Cancelled(SLACK_REDACTED, detail="every entry was redacted before the post")
        return await self._post(attempt, body, content)

    async def _content(self, conn: AsyncConnection[Any], turn_id: str) -> _Content | None:
        cursor = await conn.execute(self._sql["post_content"], {"turn_id": turn_id})
        row = await cursor.fetchone()
        return None if row is None else _Content(*row)

    def _metadata(self, attempt: ActionAttempt, body: SlackPost, content: _Content) -> Any:
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
        self, attempt: ActionAttempt, body: SlackPost, content: _Content
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
        aiohttp, _, errors = _lib()
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
            return self._refused(attempt, _answer(exc))
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
        warnings = _warnings(response)
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

    def _refused(self, attempt: ActionAttempt, answer: _Answer) -> AdapterResult:
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

    def _window_wait(self, elapsed: timedelta) -> timedelta | None:
        """How long until a complete read of the history proves the post absent: the adapter's
        own wait for the Reread, or None (the window has passed) for the core's."""
        left = timedelta(seconds=self.settings.readback_window_seconds) - elapsed
        return left if left > timedelta(0) else None

    # -- after an unknown write: read only -------------------------------------------------------

    async def _read_back(
        self, attempt: ActionAttempt, body: SlackPost, content: _Content | None
    ) -> AdapterResult:
        fenced_at = attempt.action.write_started_at
        if content is None or fenced_at is None:
            # The turn is gone (erased) or the fence's time unknown: nothing to read against.
            self._event("slack.readback.unreadable", attempt, logging.WARNING, error="no turn")
            return Uncertain(SLACK_HISTORY_UNREADABLE, detail="the turn is gone: nothing to read")
        aiohttp, _, errors = _lib()
        clients = self._clients.get()
        skew = timedelta(seconds=self.settings.readback_clock_skew_seconds)
        oldest = _slack_ts(fenced_at - skew)
        latest = _slack_ts(fenced_at + self.fence_margin + skew)
        cursor = content.cursor
        started_at = (
            content.started_at if cursor is not None and content.started_at else content.now
        )
        try:
            identity = await self._whoami(clients)
        except errors.SlackApiError as exc:
            return await self._unread(
                attempt, body, _answer(exc), cursor, started_at, call="auth.test"
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed = _Answer(0, type(exc).__name__, None)
            return await self._unread(attempt, body, failed, cursor, started_at, call="auth.test")
        if identity is None:
            self._event("slack.readback.unreadable", attempt, logging.WARNING, error="no identity")
            return Uncertain(
                SLACK_HISTORY_UNREADABLE,
                detail="auth.test named no user_id or bot_id: the post cannot be told apart",
            )
        foreign = 0
        method = "conversations.history" if content.thread_ts is None else "conversations.replies"
        for _page in range(self.settings.readback_pages_per_attempt):
            params: dict[str, Any] = {
                "channel": content.channel,
                "oldest": oldest,
                "latest": latest,
                "inclusive": True,
                "limit": self.settings.readback_page_limit,
                "include_all_metadata": True,
            }
            if cursor is not None:
                params["cursor"] = cursor
            try:
                if content.thread_ts is None:
                    page = await clients.read.conversations_history(**params)
                else:
                    page = await clients.read.conversations_replies(ts=content.thread_ts, **params)
            except errors.SlackApiError as exc:
                answer = _answer(exc)
                return await self._unread(attempt, body, answer, cursor, started_at, call=method)
            except (aiohttp.ClientError, TimeoutError) as exc:
                failed = _Answer(0, type(exc).__name__, None)
                return await self._unread(attempt, body, failed, cursor, started_at, call=method)
            for message in page.get("messages") or []:
                if not _names_key(message, attempt.idempotency_key):
                    continue
                if not identity.wrote(message):
                    # Our metadata in another's message (a planted marker): never the post.
                    foreign += 1
                    action_event(
                        "readback.foreign_marker",
                        attempt.id,
                        attempt.kind,
                        level=logging.WARNING,
                        author=_Identity.author(message),
                        ref=str(message["ts"]),
                    )
                    continue
                self._event("slack.readback.found", attempt, logging.INFO)
                return Done(
                    message_ref(content.channel, str(message["ts"])),
                    detail="found in the history read back" + _ignored(foreign),
                )
            metadata = page.get("response_metadata") or {}
            next_cursor = metadata.get("next_cursor") if isinstance(metadata, dict) else None
            if not next_cursor:
                if page.get("has_more"):
                    self._event(
                        "slack.readback.unreadable", attempt, logging.WARNING, error="no cursor"
                    )
                    return Uncertain(
                        SLACK_HISTORY_UNREADABLE, detail="Slack has_more without a cursor"
                    )
                return await self._absent(attempt, body, started_at, fenced_at, foreign)
            cursor = str(next_cursor)
        await self._save(attempt, body, cursor, started_at)
        return Reread(detail=f"{method}: more pages to read, the cursor kept")

    async def _whoami(self, clients: _Clients) -> _Identity | None:
        """Who the token posts as: asked of ``auth.test`` once, then kept (None: its answer
        named neither a user nor a bot)."""
        async with clients.identity_lock:
            if self._identity is None:
                answer = await clients.read.auth_test()
                user_id, bot_id = _named(answer.get("user_id")), _named(answer.get("bot_id"))
                if user_id is None and bot_id is None:
                    return None
                self._identity = _Identity(user_id, bot_id)
        return self._identity

    async def _absent(
        self,
        attempt: ActionAttempt,
        body: SlackPost,
        started_at: datetime,
        fenced_at: datetime,
        foreign: int,
    ) -> AdapterResult:
        """The history was read completely and the post is not in it."""
        await self._save(attempt, body, None, None)
        waited = started_at - fenced_at
        if waited >= timedelta(seconds=self.settings.readback_window_seconds):
            self._event("slack.readback.absent", attempt, logging.WARNING)
            return Cancelled(
                StopReason.ABSENT, detail="not in the history read back" + _ignored(foreign)
            )
        # Slack may not show a new message at once: a post missing this soon may still appear.
        self._event("slack.readback.too_soon", attempt, logging.INFO)
        return Reread(
            after=self._window_wait(waited),
            detail="not in the history yet: read again later" + _ignored(foreign),
        )

    async def _unread(
        self,
        attempt: ActionAttempt,
        body: SlackPost,
        answer: _Answer,
        cursor: str | None,
        started_at: datetime,
        *,
        call: str,
    ) -> AdapterResult:
        """A history page (or ``auth.test`` before it: ``call``) did not come back. A failure
        for now rereads, bounded by time (the core's ``unreadable_for``), not by attempts: the
        wait is Slack's ``Retry-After`` when it names one, else the core's growing wait."""
        fields = {"status": answer.status, "error": answer.error}
        transient = (
            answer.status == 429
            or answer.status >= 500
            or answer.status == 0
            or answer.error in RATE_LIMITED
            or answer.error in MAYBE_WRITTEN
            or answer.error in NOT_TAKEN
        )
        detail = f"{call}: {answer.detail()}"
        if not transient:
            self._event("slack.readback.unreadable", attempt, logging.WARNING, **fields)
            return Uncertain(SLACK_HISTORY_UNREADABLE, detail=detail)
        await self._save(attempt, body, cursor, started_at if cursor is not None else None)
        rate_limited = answer.status == 429 or answer.error in RATE_LIMITED
        if rate_limited and answer.retry_after is not None:
            wait = max(answer.retry_after, 0.0)
            self._event("slack.readback.retry", attempt, logging.INFO, wait=wait, **fields)
            return Reread(after=timedelta(seconds=wait), detail=f"{detail}: Retry-After {wait:g} s")
        self._event("slack.readback.retry", attempt, logging.INFO, **fields)
        return Reread(detail=f"{detail}: not read")

    async def _save(
        self,
        attempt: ActionAttempt,
        body: SlackPost,
        cursor: str | None,
        started_at: datetime | None,
    ) -> None:
        """Keep the read's progress on the turn's row, under the attempt's lease."""
        async with attempt.transaction() as conn:
            await conn.execute(
                self._sql["save_readback"],
                {"turn_id": body.turn_id, "cursor": cursor, "started_at": started_at},
            )

    @staticmethod
    def _event(name: str, attempt: ActionAttempt, level: int, **fields: Any) -> None:
        action_event(name, attempt.id, attempt.kind, level=level, **fields)


def _answer(exc: Any) -> _Answer:
    """Status, Slack error and Retry-After (in seconds) of a ``SlackApiError``."""
    response = getattr(exc, "response", None)
    status = int(getattr(response, "status_code", 0) or 0)
    data = getattr(response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    headers = getattr(response, "headers", None) or {}
    wait = (
        retry_after(headers.get("Retry-After"), date=headers.get("Date"))
        if hasattr(headers, "get")
        else None
    )
    seconds = None if wait is None else wait.total_seconds()
    return _Answer(status, str(error) if error is not None else None, seconds)


def _slack_ts(moment: datetime) -> str:
    """A Slack timestamp (``1700000000.000100``) for a moment."""
    return f"{moment.timestamp():.6f}"


def _length_check_steps(check: EnqueueCheck) -> Steps[None]:
    """The enqueue check: the turn's stored entries (what the post would send) fit Slack's limit.
    A turn not stored yet has nothing to measure (its entry point checks what it stores)."""
    body = cast(SlackPost, check.body)
    rows = yield Query(queries(check.schema)["post_content"], {"turn_id": body.turn_id})
    if rows:
        check_length(body.turn_id, _Content(*rows[0]).texts)


def _warnings(response: Any) -> list[str]:
    """The warnings of an ``ok: true`` answer that may concern the message: ``warning`` (one
    code, or several separated by commas) and ``response_metadata.warnings``, without those
    about the request's encoding (one that does not look like one of Slack's codes is named
    ``unrecognised``, never kept as it came)."""
    found: set[str] = set()
    top = response.get("warning")
    if isinstance(top, str):
        found.update(part.strip() for part in top.split(","))
    metadata = response.get("response_metadata")
    listed = metadata.get("warnings") if isinstance(metadata, dict) else None
    if isinstance(listed, list):
        found.update(str(name).strip() for name in listed)
    return sorted(
        {
            name if _SLACK_CODE.fullmatch(name) else "unrecognised"
            for name in found - REQUEST_WARNINGS
            if name
        }
    )


def _names_key(message: Any, key: str) -> bool:
    """Whether a history message carries a post's metadata naming ``key`` (whoever wrote it)."""
    if not isinstance(message, dict) or not message.get("ts"):
        return False
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
        return False
    payload = metadata.get("event_payload")
    return isinstance(payload, dict) and payload.get("idempotency_key") == key


def _ignored(foreign: int) -> str:
    """A read's detail's note of the planted markers it passed over."""
    if not foreign:
        return ""
    return f" (ignored {foreign} by another author with this key)"


def _named(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
