"""A Slack Web API server on loopback, built on the core's loopback base
(:class:`outbox_core.testing.loopback_http.LoopbackHTTPServer`), that keeps channels and
messages and fails on demand like Slack: ``ok: false`` errors, HTTP 429 with ``Retry-After``,
5xx, a connection dropped before or after a post was recorded, a stall, history refused or
broken off, a new post hidden from history for a while, and Slack's one-request-a-minute limit
on history for apps outside its Marketplace. It cuts a post's text over 40,000 characters and
answers ``ok: true`` with the warning ``message_truncated``, as Slack does, and holds messages
that other apps and people posted with this package's metadata (a planted marker).

It speaks what ``SLACK_POST`` uses, with Slack's request and response shapes: ``auth.test``,
``chat.postMessage``, ``conversations.history`` and ``conversations.replies`` (``cursor``,
``limit``, ``oldest``, ``latest``, ``inclusive``, ``include_all_metadata``). Arguments come as a
query string, a form body or a JSON body; the token as ``Authorization: Bearer`` (or a ``token``
argument): none is ``not_authed``, a wrong one ``invalid_auth``.

It serves in its own threads, so sync tests (``outbox_db.drain()``) and async tests alike.
The messages, channels, answer shapes and history pages are in
:mod:`outbox_slack.testing.conversations`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Literal

from outbox_core.testing.faults import Fault, FaultQueue, NewWrites, Outage
from outbox_core.testing.loopback_http import Exchange, LoopbackHTTPServer, Received

from ..settings import SlackSettings
from ..slack_api import EVENT_TYPE
from .conversations import (
    BOT_ID,
    BOT_USER,
    METHODS,
    OTHER_APP,
    OTHER_BOT,
    OTHER_USER,
    PERSON,
    READS,
    TEAM_ID,
    TEXT_LIMIT,
    TOKEN,
    Channel,
    Message,
    arguments,
    fail,
    history_page,
    ok,
    posted,
    refused,
    unavailable,
)

STALL_SECONDS = 3600.0
FaultAction = Literal[
    "error", "status", "drop_before", "drop_after", "stall", "break_cursor", "warn"
]
HISTORIES = ("conversations.history", "conversations.replies")


class SlackTestServer(LoopbackHTTPServer):
    """A stateful Slack Web API on ``127.0.0.1``; use as a context manager (or start/stop).

    Point the adapter at it with :meth:`settings` (or ``outbox_slack.testing.serve_slack``).
    ``requests[method]`` counts the requests per method; :attr:`posts` lists every post it
    recorded (also those whose answer it then dropped); :meth:`posts_for` those of one action.
    """

    thread_name = "slack-test-server"
    server_version = "loopback-slack"
    json_content_type = "application/json; charset=utf-8"

    def __init__(
        self, *, token: str = TOKEN, user_id: str = BOT_USER, bot_id: str = BOT_ID
    ) -> None:
        super().__init__(stall_seconds=STALL_SECONDS)
        self.token = token
        self.user_id = user_id
        """The bot user the token posts as (``auth.test``'s ``user_id``, each post's ``user``)."""
        self.bot_id = bot_id
        """The bot the token posts as (``auth.test``'s ``bot_id``, each post's ``bot_id``)."""
        self.text_limit = TEXT_LIMIT
        self.channels: dict[str, Channel] = {}
        self.posts: list[Message] = []
        self.requests: Counter[str] = Counter()
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        """(method, arguments) of every request, in order (tests check what was asked)."""
        self._faults: FaultQueue[Fault] = FaultQueue()
        self._hiding = NewWrites()
        self._history_limit: tuple[float, int] | None = None
        self._outage: Outage | None = None
        self._history_calls: dict[str, list[float]] = {}
        self._clock = 0

    @property
    def base_url(self) -> str:
        return f"{self.origin}/api/"

    def settings(self, **values: Any) -> SlackSettings:
        """Settings that reach this server with its token (``values`` override, e.g. short
        timeouts or ``readback_window_seconds=0``)."""
        defaults: dict[str, Any] = {
            "token": self.token,
            "base_url": self.base_url,
            "connect_timeout_seconds": 2.0,
            "request_timeout_seconds": 2.0,
        }
        return SlackSettings(**{**defaults, **values})

    # -- state ---------------------------------------------------------------------------------

    def add_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        member: bool = True,
        archived: bool = False,
    ) -> Channel:
        """A conversation; ``member=False``: the bot is not in it (``not_in_channel``)."""
        with self.lock:
            channel = Channel(channel_id, name or channel_id.lower(), member, archived)
            self.channels[channel_id] = channel
            return channel

    def add_message(
        self,
        channel_id: str,
        text: str,
        *,
        thread_ts: str | None = None,
        metadata: dict[str, Any] | None = None,
        user: str | None = PERSON,
        bot_id: str | None = None,
        app_id: str | None = None,
    ) -> Message:
        """A message someone else posted (a thread's parent, the channel's other traffic): a
        person's (``user``), or another app's (``bot_id``, ``app_id``)."""
        with self.lock:
            message = Message(
                channel_id, self._next_ts(), text, thread_ts, metadata, user, bot_id, app_id
            )
            self.channels[channel_id].messages.append(message)
            return message

    def plant_marker(
        self,
        channel_id: str,
        idempotency_key: str,
        *,
        thread_ts: str | None = None,
        user: str | None = OTHER_USER,
        bot_id: str | None = OTHER_BOT,
        app_id: str | None = OTHER_APP,
    ) -> Message:
        """A message that carries a ``SLACK_POST``'s metadata (its ``idempotency_key``) but was
        posted by another identity: another app's bot by default, a person with
        ``bot_id=None, app_id=None``. The key is predictable (``slack_post:<turn_id>``), so
        anyone who can post to the channel can plant one ahead of the real post."""
        metadata = {
            "event_type": EVENT_TYPE,
            "event_payload": {"idempotency_key": idempotency_key},
        }
        return self.add_message(
            channel_id,
            "planted",
            thread_ts=thread_ts,
            metadata=metadata,
            user=user,
            bot_id=bot_id,
            app_id=app_id,
        )

    def posts_for(self, idempotency_key: str) -> list[Message]:
        """The recorded posts whose metadata names ``idempotency_key`` (one action's writes)."""
        with self.lock:
            return [post for post in self.posts if post.idempotency_key == idempotency_key]

    def _next_ts(self) -> str:
        # Slack's ts: seconds and a sequence in the microseconds, unique in a channel.
        self._clock += 1
        return f"{int(time.time())}.{self._clock:06d}"

    # -- faults ----------------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        error: str,
        *,
        times: int | None = 1,
        status: int = 200,
        retry_after: float | None = None,
    ) -> None:
        """Answer ``method`` with ``{"ok": false, "error": error}`` (HTTP ``status``), without
        recording anything. ``times=None``: until :meth:`clear_faults`."""
        headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
        self._add(Fault(method, "error", times, status, headers=headers, detail=error))

    def rate_limit(self, method: str, *, retry_after: float = 1.0, times: int | None = 1) -> None:
        """Answer HTTP 429 with ``Retry-After`` and ``{"ok": false, "error": "ratelimited"}``."""
        self.fail(method, "ratelimited", times=times, status=429, retry_after=retry_after)

    def server_error(self, method: str, *, status: int = 503, times: int | None = 1) -> None:
        """Answer an HTTP 5xx with an HTML body, as a proxy in front of Slack does."""
        self._add(Fault(method, "status", times, status=status))

    def drop_before_recording(self, method: str = "chat.postMessage", *, times: int = 1) -> None:
        """Close the connection on the request without recording it (nothing was written)."""
        self._add(Fault(method, "drop_before", times))

    def drop_after_recording(self, method: str = "chat.postMessage", *, times: int = 1) -> None:
        """Record the post, then close the connection before answering (it exists)."""
        self._add(Fault(method, "drop_after", times))

    def stall(
        self,
        method: str = "chat.postMessage",
        *,
        times: int = 1,
        seconds: float = STALL_SECONDS,
        after_recording: bool = False,
    ) -> None:
        """Wait ``seconds`` before answering (past the client's timeout); a post stalled
        ``after_recording`` exists."""
        recorded = "recorded" if after_recording else None
        self._add(Fault(method, "stall", times, seconds=seconds, detail=recorded))

    def warn(self, warning: str, *, times: int | None = 1) -> None:
        """Record the post and answer ``ok: true`` with ``warning`` (at the top, comma-separated
        when there are several, and in ``response_metadata.warnings``), as Slack does for a call
        it carried out with a problem."""
        self._add(Fault("chat.postMessage", "warn", times, detail=warning))

    def break_cursor(self, method: str = "conversations.history", *, times: int = 1) -> None:
        """Answer a history page with ``has_more: true`` and no ``next_cursor``."""
        self._add(Fault(method, "break_cursor", times))

    def hide_new_posts(self, *, reads: int = 0, seconds: float = 0.0) -> None:
        """Posts from now on are left out of history for their channel's next ``reads`` history
        reads, or for ``seconds`` (eventual visibility)."""
        with self.lock:
            self._hiding.hide(reads=reads, seconds=seconds)

    def reveal(self) -> None:
        """Show every hidden message now."""
        with self.lock:
            for channel in self.channels.values():
                for message in channel.messages:
                    message.hidden_reads, message.hidden_until = 0, 0.0

    def outage(
        self,
        seconds: float,
        *,
        status: int = 503,
        error: str | None = None,
        methods: tuple[str, ...] = READS,
    ) -> None:
        """Make the reads unreadable for ``seconds`` from now (on this process's monotonic
        clock): each request of ``methods`` answers HTTP ``status`` with an HTML body, as a
        proxy in front of a Slack that is down does, or, with ``error``, ``{"ok": false,
        "error": error}`` (``internal_error``). Posts still work. ``outage(0)`` or
        :meth:`clear_faults` ends it; :attr:`outage_answers` counts the requests it refused."""
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise ValueError(f"{unknown}: the server speaks {', '.join(METHODS)}")
        with self.lock:
            self._outage = Outage.lasting(seconds, ops=methods, status=status, detail=error)

    @property
    def outage_answers(self) -> int:
        """The requests the current (or last) outage refused."""
        with self.lock:
            return 0 if self._outage is None else self._outage.answered

    def limit_history(self, *, per_minute: int = 1, page_max: int = 15) -> None:
        """Slack's limits for apps outside its Marketplace (May 2025): ``per_minute`` requests
        of conversations.history and of conversations.replies, then 429 with the wait left as
        ``Retry-After``; at most ``page_max`` messages a page."""
        with self.lock:
            self._history_limit = (float(per_minute), page_max)

    def truncate_text(self, *, at: int = TEXT_LIMIT) -> None:
        """Keep ``at`` characters of a post's text and cut the rest, answering ``ok: true`` with
        the warning ``message_truncated`` (Slack: 40,000, the default; lower it for a Slack
        that cuts sooner than it documents)."""
        with self.lock:
            self.text_limit = at

    def clear_faults(self) -> None:
        """Forget every fault set with ``times`` (``fail``, ``server_error``, ``drop_*``,
        ``stall``, ``warn``, ``break_cursor``) and end an outage."""
        with self.lock:
            self._faults.clear()
            if self._outage is not None:
                self._outage.end()

    def _add(self, fault: Fault) -> None:
        if fault.op not in METHODS:
            raise ValueError(f"{fault.op!r}: the server speaks {', '.join(METHODS)}")
        self._faults.add(fault.op, fault, fault.times)

    # -- the API -------------------------------------------------------------------------------

    def serve(self, request: Received, exchange: Exchange) -> None:
        method = request.path.removeprefix("/api/")
        args = arguments(request)
        with self.lock:
            self.requests[method] += 1
            self.bodies.append((method, {k: v for k, v in args.items() if k != "token"}))
        if not request.path.startswith("/api/") or method not in METHODS:
            raise fail("unknown_method")
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.startswith("Bearer ") else args.get("token")
        if not token:
            raise fail("not_authed")
        if token != self.token:
            raise fail("invalid_auth")
        fault = self._faults.take(method)
        if fault is not None:
            match fault.mode:
                case "error":
                    raise fail(str(fault.detail), status=fault.status, headers=fault.headers)
                case "status":
                    raise unavailable(fault.status)
                case "drop_before":
                    exchange.drop()
                    return
                case "stall" if fault.detail != "recorded":
                    self.stall_here(fault.seconds)
                    raise fail("request_timeout")
        self._refuse_if_down(method)
        self._refuse_if_limited(method)
        match method:
            case "auth.test":
                exchange.send(
                    200,
                    ok(
                        {
                            "url": "https://outbox-test.slack.com/",
                            "team": "outbox test",
                            "user": "outbox",
                            "team_id": TEAM_ID,
                            "user_id": self.user_id,
                            "bot_id": self.bot_id,
                        }
                    ),
                )
            case "chat.postMessage":
                warning = fault.detail if fault is not None and fault.mode == "warn" else None
                answer = self._post(args, warning=warning)
                if fault is not None and fault.mode == "drop_after":
                    exchange.drop()
                    return
                if fault is not None and fault.mode == "stall":
                    self.stall_here(fault.seconds)
                exchange.send(200, answer)
            case _:
                broken = fault is not None and fault.mode == "break_cursor"
                with self.lock:
                    channel = self.channels.get(str(args.get("channel") or ""))
                    page_max = None if self._history_limit is None else self._history_limit[1]
                    page = history_page(channel, method, args, page_max=page_max, broken=broken)
                exchange.send(200, ok(page))

    def _refuse_if_down(self, method: str) -> None:
        with self.lock:
            outage = self._outage
            if outage is None or not outage.refuses(method):
                return
        raise fail(outage.detail) if outage.detail is not None else unavailable(outage.status)

    def _refuse_if_limited(self, method: str) -> None:
        if method not in HISTORIES:
            return
        with self.lock:
            if self._history_limit is None:
                return
            per_minute = int(self._history_limit[0])
            now = time.monotonic()
            calls = [at for at in self._history_calls.get(method, []) if now - at < 60.0]
            self._history_calls[method] = calls
            if len(calls) >= per_minute:
                wait = max(60.0 - (now - calls[0]), 1.0)
                raise fail("ratelimited", status=429, headers={"Retry-After": str(int(wait))})
            calls.append(now)

    def _post(self, args: dict[str, Any], *, warning: str | None = None) -> dict[str, Any]:
        """Record a post; Slack's answer (``ok: false`` for a post it refuses: the answer of a
        refused post is dropped or stalled as an accepted one's is)."""
        channel_id = str(args.get("channel") or "")
        text = args.get("text")
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                return refused("invalid_metadata_format")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        ):
            return refused("invalid_metadata_schema")
        with self.lock:
            channel = self._find(channel_id)
            if channel is None:
                return refused("channel_not_found")
            if not channel.member:
                return refused("not_in_channel")
            if channel.archived:
                return refused("is_archived")
            if not text and not args.get("blocks"):
                return refused("no_text")
            kept = str(text or "")
            truncated = len(kept) > self.text_limit
            if truncated:
                kept = kept[: self.text_limit]
            thread_ts = args.get("thread_ts") or None
            message = Message(
                channel.id,
                self._next_ts(),
                kept,
                str(thread_ts) if thread_ts else None,
                metadata,
                user=self.user_id,
                bot_id=self.bot_id,
                hidden_reads=self._hiding.reads,
                hidden_until=self._hiding.hidden_until(),
            )
            channel.messages.append(message)
            self.posts.append(message)
        return ok(posted(message, warning, self.text_limit if truncated else None))

    def _find(self, channel_id: str) -> Channel | None:
        if channel_id in self.channels:
            return self.channels[channel_id]
        name = channel_id.lstrip("#")
        return next((c for c in self.channels.values() if c.name == name), None)
