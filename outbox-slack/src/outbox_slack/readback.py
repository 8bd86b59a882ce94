"""The read-back of a ``SLACK_POST`` (:class:`SlackReadBack`, a base class of the adapter): the
channel's history, or the thread's replies, searched for the post by its metadata.

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

The read covers ``oldest`` = the fence's time minus ``readback_clock_skew_seconds`` to
``latest`` = the fence's time plus the fence margin (the post ended within it) plus the skew,
with ``include_all_metadata=true``, ``conversations.history`` for a top-level post and
``conversations.replies`` for a threaded one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from outbox_core import (
    ActionAttempt,
    AdapterResult,
    Cancelled,
    Done,
    PerLoop,
    Reread,
    StopReason,
    Uncertain,
    action_event,
)

from .domain import message_ref
from .settings import SlackSettings
from .slack_api import (
    EVENT_TYPE,
    MAYBE_WRITTEN,
    NOT_TAKEN,
    RATE_LIMITED,
    SLACK_CODE,
    SLACK_HISTORY_UNREADABLE,
    SlackAnswer,
    SlackClients,
    answer_of,
    slack_libraries,
)


@dataclass(frozen=True, slots=True)
class TurnContent:
    channel: str
    thread_ts: str | None
    cursor: str | None
    started_at: datetime | None
    now: datetime
    entry_ids: list[str]
    entry_kinds: list[str]
    texts: list[str]


@dataclass(frozen=True, slots=True)
class PostingIdentity:
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
        return str(author) if isinstance(author, str) and SLACK_CODE.fullmatch(author) else "?"


class SlackReadBack:
    """The read-back half of :class:`outbox_slack.adapter.SlackPostAdapter` (a base class of it),
    and the wait both halves name for a Reread."""

    settings: SlackSettings
    fence_margin: timedelta
    _sql: dict[str, str]
    _clients: PerLoop[SlackClients]
    _identity: PostingIdentity | None

    def _window_wait(self, elapsed: timedelta) -> timedelta | None:
        """How long until a complete read of the history proves the post absent: the adapter's
        own wait for the Reread, or None (the window has passed) for the core's."""
        left = timedelta(seconds=self.settings.readback_window_seconds) - elapsed
        return left if left > timedelta(0) else None

    # -- after an unknown write: read only -------------------------------------------------------

    async def _read_back(
        self, attempt: ActionAttempt, turn_id: str, content: TurnContent | None
    ) -> AdapterResult:
        fenced_at = attempt.action.write_started_at
        if content is None or fenced_at is None:
            # The turn is gone (erased) or the fence's time unknown: nothing to read against.
            self._event("slack.readback.unreadable", attempt, logging.WARNING, error="no turn")
            return Uncertain(SLACK_HISTORY_UNREADABLE, detail="the turn is gone: nothing to read")
        aiohttp, _, errors = slack_libraries()
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
                attempt, turn_id, answer_of(exc), cursor, started_at, call="auth.test"
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed = SlackAnswer(0, type(exc).__name__, None)
            return await self._unread(
                attempt, turn_id, failed, cursor, started_at, call="auth.test"
            )
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
                answer = answer_of(exc)
                return await self._unread(attempt, turn_id, answer, cursor, started_at, call=method)
            except (aiohttp.ClientError, TimeoutError) as exc:
                failed = SlackAnswer(0, type(exc).__name__, None)
                return await self._unread(attempt, turn_id, failed, cursor, started_at, call=method)
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
                        author=PostingIdentity.author(message),
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
                return await self._absent(attempt, turn_id, started_at, fenced_at, foreign)
            cursor = str(next_cursor)
        await self._save(attempt, turn_id, cursor, started_at)
        return Reread(detail=f"{method}: more pages to read, the cursor kept")

    async def _whoami(self, clients: SlackClients) -> PostingIdentity | None:
        """Who the token posts as: asked of ``auth.test`` once, then kept (None: its answer
        named neither a user nor a bot)."""
        async with clients.identity_lock:
            if self._identity is None:
                answer = await clients.read.auth_test()
                user_id, bot_id = _named(answer.get("user_id")), _named(answer.get("bot_id"))
                if user_id is None and bot_id is None:
                    return None
                self._identity = PostingIdentity(user_id, bot_id)
        return self._identity

    async def _absent(
        self,
        attempt: ActionAttempt,
        turn_id: str,
        started_at: datetime,
        fenced_at: datetime,
        foreign: int,
    ) -> AdapterResult:
        """The history was read completely and the post is not in it."""
        await self._save(attempt, turn_id, None, None)
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
        turn_id: str,
        answer: SlackAnswer,
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
        await self._save(attempt, turn_id, cursor, started_at if cursor is not None else None)
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
        turn_id: str,
        cursor: str | None,
        started_at: datetime | None,
    ) -> None:
        """Keep the read's progress on the turn's row, under the attempt's lease."""
        async with attempt.transaction() as conn:
            await conn.execute(
                self._sql["save_readback"],
                {"turn_id": turn_id, "cursor": cursor, "started_at": started_at},
            )

    @staticmethod
    def _event(name: str, attempt: ActionAttempt, level: int, **fields: Any) -> None:
        action_event(name, attempt.id, attempt.kind, level=level, **fields)


def _slack_ts(moment: datetime) -> str:
    """A Slack timestamp (``1700000000.000100``) for a moment."""
    return f"{moment.timestamp():.6f}"


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
