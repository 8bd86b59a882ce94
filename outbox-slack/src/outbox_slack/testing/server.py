"""A Slack Web API server on loopback, built on aiohttp's web server, that keeps channels and
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

It runs its own event loop in a thread, so it serves sync tests (``outbox_db.drain()``) and
async tests alike.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiohttp import web

from ..settings import SlackSettings
from ..slack_api import EVENT_TYPE

TOKEN = "xoxb-outbox-test-token"
TEAM_ID = "T0TEST"
BOT_USER = "U0BOT"
BOT_ID = "B0BOT"
APP_ID = "A0OUTBOX"
PERSON = "U0PERSON"
"""The user of the messages a test adds as someone's (:meth:`SlackTestServer.add_message`)."""
OTHER_USER = "U0OTHER"
OTHER_BOT = "B0OTHER"
OTHER_APP = "A0OTHER"
"""Another app's bot user, bot and app (the default author of a planted marker)."""
TEXT_LIMIT = 40_000
"""The characters of a post's text that Slack keeps (it cuts the rest, with a warning)."""
STALL_SECONDS = 3600.0
METHODS = ("auth.test", "chat.postMessage", "conversations.history", "conversations.replies")
READS = ("auth.test", "conversations.history", "conversations.replies")
"""What a read-back calls: what an outage (:meth:`SlackTestServer.outage`) makes unreadable."""

FaultAction = Literal[
    "error", "status", "drop_before", "drop_after", "stall", "break_cursor", "warn"
]
T = TypeVar("T")


@dataclass
class Message:
    """One message the server holds (a post it recorded, or one a test added)."""

    channel: str
    ts: str
    text: str
    thread_ts: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = BOT_USER
    """The author's user id (a bot's user, or a person)."""
    bot_id: str | None = BOT_ID
    """The author's bot id; None for a person's message."""
    app_id: str | None = APP_ID
    hidden_reads: int = 0
    """History reads of its channel that do not show it yet (eventual visibility)."""
    hidden_until: float = 0.0
    """A monotonic time before which history does not show it."""

    @property
    def idempotency_key(self) -> str | None:
        payload = (self.metadata or {}).get("event_payload")
        return payload.get("idempotency_key") if isinstance(payload, dict) else None

    def visible(self, now: float) -> bool:
        return self.hidden_reads <= 0 and now >= self.hidden_until

    def as_slack(self, *, with_metadata: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text}
        authors = {"user": self.user, "bot_id": self.bot_id, "app_id": self.app_id}
        out.update({name: value for name, value in authors.items() if value is not None})
        out["team"] = TEAM_ID
        if self.thread_ts is not None:
            out["thread_ts"] = self.thread_ts
        if with_metadata and self.metadata is not None:
            out["metadata"] = self.metadata
        return out


@dataclass
class Channel:
    id: str
    name: str
    member: bool = True
    archived: bool = False
    messages: list[Message] = field(default_factory=list)


@dataclass
class _Fault:
    method: str
    action: FaultAction
    times: int | None
    error: str | None = None
    status: int = 200
    retry_after: float | None = None
    seconds: float = STALL_SECONDS


@dataclass
class _Outage:
    until: float
    status: int
    error: str | None
    methods: frozenset[str]
    answered: int = 0


class SlackTestServer:
    """A stateful Slack Web API on ``127.0.0.1``; use as a context manager (or start/stop).

    Point the adapter at it with :meth:`settings` (or ``outbox_slack.testing.serve_slack``).
    ``requests[method]`` counts the requests per method; :attr:`posts` lists every post it
    recorded (also those whose answer it then dropped); :meth:`posts_for` those of one action.
    """

    def __init__(
        self, *, token: str = TOKEN, user_id: str = BOT_USER, bot_id: str = BOT_ID
    ) -> None:
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
        self._faults: list[_Fault] = []
        self._hide_reads = 0
        self._hide_seconds = 0.0
        self._history_limit: tuple[float, int] | None = None
        self._outage: _Outage | None = None
        self._history_calls: dict[str, list[float]] = {}
        self._clock = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> SlackTestServer:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="slack-test-server", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the Slack test server did not start within 10 s")
        return self

    async def _serve(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            if self._release is not None:
                self._release.set()
            if self._runner is not None:
                await self._runner.cleanup()

        self._call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> SlackTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

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
        with self._lock:
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
        with self._lock:
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
        with self._lock:
            return [post for post in self.posts if post.idempotency_key == idempotency_key]

    def _next_ts(self) -> str:
        # Slack's ts: seconds and a sequence in the microseconds, unique in a channel.
        self._clock += 1
        return f"{int(time.time())}.{self._clock:06d}"

    # -- faults --------------------------------------------------------------------------------

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
        self._add(_Fault(method, "error", times, error, status, retry_after))

    def rate_limit(self, method: str, *, retry_after: float = 1.0, times: int | None = 1) -> None:
        """Answer HTTP 429 with ``Retry-After`` and ``{"ok": false, "error": "ratelimited"}``."""
        self.fail(method, "ratelimited", times=times, status=429, retry_after=retry_after)

    def server_error(self, method: str, *, status: int = 503, times: int | None = 1) -> None:
        """Answer an HTTP 5xx with an HTML body, as a proxy in front of Slack does."""
        self._add(_Fault(method, "status", times, status=status))

    def drop_before_recording(self, method: str = "chat.postMessage", *, times: int = 1) -> None:
        """Close the connection on the request without recording it (nothing was written)."""
        self._add(_Fault(method, "drop_before", times))

    def drop_after_recording(self, method: str = "chat.postMessage", *, times: int = 1) -> None:
        """Record the post, then close the connection before answering (it exists)."""
        self._add(_Fault(method, "drop_after", times))

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
        self._add(_Fault(method, "stall", times, error=recorded, seconds=seconds))

    def warn(self, warning: str, *, times: int | None = 1) -> None:
        """Record the post and answer ``ok: true`` with ``warning`` (at the top, comma-separated
        when there are several, and in ``response_metadata.warnings``), as Slack does for a call
        it carried out with a problem."""
        self._add(_Fault("chat.postMessage", "warn", times, error=warning))

    def break_cursor(self, method: str = "conversations.history", *, times: int = 1) -> None:
        """Answer a history page with ``has_more: true`` and no ``next_cursor``."""
        self._add(_Fault(method, "break_cursor", times))

    def hide_new_posts(self, *, reads: int = 0, seconds: float = 0.0) -> None:
        """Posts from now on are left out of history for their channel's next ``reads`` history
        reads, or for ``seconds`` (eventual visibility)."""
        with self._lock:
            self._hide_reads, self._hide_seconds = reads, seconds

    def reveal(self) -> None:
        """Show every hidden message now."""
        with self._lock:
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
        with self._lock:
            self._outage = _Outage(time.monotonic() + seconds, status, error, frozenset(methods))

    @property
    def outage_answers(self) -> int:
        """The requests the current (or last) outage refused."""
        with self._lock:
            return 0 if self._outage is None else self._outage.answered

    def limit_history(self, *, per_minute: int = 1, page_max: int = 15) -> None:
        """Slack's limits for apps outside its Marketplace (May 2025): ``per_minute`` requests
        of conversations.history and of conversations.replies, then 429 with the wait left as
        ``Retry-After``; at most ``page_max`` messages a page."""
        with self._lock:
            self._history_limit = (float(per_minute), page_max)

    def truncate_text(self, *, at: int = TEXT_LIMIT) -> None:
        """Keep ``at`` characters of a post's text and cut the rest, answering ``ok: true`` with
        the warning ``message_truncated`` (Slack: 40,000, the default; lower it for a Slack
        that cuts sooner than it documents)."""
        with self._lock:
            self.text_limit = at

    def clear_faults(self) -> None:
        """Forget every fault set with ``times`` (``fail``, ``server_error``, ``drop_*``,
        ``stall``, ``warn``, ``break_cursor``) and end an outage."""
        with self._lock:
            self._faults.clear()
            if self._outage is not None:
                self._outage.until = 0.0

    def _add(self, fault: _Fault) -> None:
        if fault.method not in METHODS:
            raise ValueError(f"{fault.method!r}: the server speaks {', '.join(METHODS)}")
        with self._lock:
            self._faults.append(fault)

    def _take(self, method: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method == method:
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    # -- the API -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args = await _arguments(request)
        with self._lock:
            self.requests[method] += 1
            self.bodies.append((method, {k: v for k, v in args.items() if k != "token"}))
        if method not in METHODS:
            return _fail("unknown_method")
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.startswith("Bearer ") else args.get("token")
        if not token:
            return _fail("not_authed")
        if token != self.token:
            return _fail("invalid_auth")
        fault = self._take(method)
        if fault is not None:
            match fault.action:
                case "error":
                    headers = {}
                    if fault.retry_after is not None:
                        headers["Retry-After"] = f"{fault.retry_after:g}"
                    return _fail(str(fault.error), status=fault.status, headers=headers)
                case "status":
                    return _unavailable(fault.status)
                case "drop_before":
                    return await self._drop(request)
                case "stall" if fault.error != "recorded":
                    await self._stall(fault.seconds)
                    return _fail("request_timeout")
        down = self._down(method)
        if down is not None:
            return down
        limited = self._limited(method)
        if limited is not None:
            return limited
        match method:
            case "auth.test":
                return _ok(
                    {
                        "url": "https://outbox-test.slack.com/",
                        "team": "outbox test",
                        "user": "outbox",
                        "team_id": TEAM_ID,
                        "user_id": self.user_id,
                        "bot_id": self.bot_id,
                    }
                )
            case "chat.postMessage":
                warning = fault.error if fault is not None and fault.action == "warn" else None
                answer = self._post(args, warning=warning)
                if fault is not None and fault.action == "drop_after" and answer.status == 200:
                    return await self._drop(request)
                if fault is not None and fault.action == "stall":
                    await self._stall(fault.seconds)
                return answer
            case _:
                broken = fault is not None and fault.action == "break_cursor"
                return self._history(method, args, broken=broken)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            transport.abort()
        raise asyncio.CancelledError  # aiohttp ends the handler without a response

    async def _stall(self, seconds: float) -> None:
        assert self._release is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._release.wait(), seconds)

    def _down(self, method: str) -> web.Response | None:
        with self._lock:
            outage = self._outage
            if outage is None or method not in outage.methods or time.monotonic() >= outage.until:
                return None
            outage.answered += 1
        return _fail(outage.error) if outage.error is not None else _unavailable(outage.status)

    def _limited(self, method: str) -> web.Response | None:
        if method not in ("conversations.history", "conversations.replies"):
            return None
        with self._lock:
            if self._history_limit is None:
                return None
            per_minute = int(self._history_limit[0])
            now = time.monotonic()
            calls = [at for at in self._history_calls.get(method, []) if now - at < 60.0]
            if len(calls) >= per_minute:
                wait = max(60.0 - (now - calls[0]), 1.0)
                self._history_calls[method] = calls
                return _fail("ratelimited", status=429, headers={"Retry-After": str(int(wait))})
            calls.append(now)
            self._history_calls[method] = calls
        return None

    def _post(self, args: dict[str, Any], *, warning: str | None = None) -> web.Response:
        channel_id = str(args.get("channel") or "")
        text = args.get("text")
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                return _fail("invalid_metadata_format")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        ):
            return _fail("invalid_metadata_schema")
        with self._lock:
            channel = self._find(channel_id)
            if channel is None:
                return _fail("channel_not_found")
            if not channel.member:
                return _fail("not_in_channel")
            if channel.archived:
                return _fail("is_archived")
            if not text and not args.get("blocks"):
                return _fail("no_text")
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
                hidden_reads=self._hide_reads,
                hidden_until=time.monotonic() + self._hide_seconds if self._hide_seconds else 0.0,
            )
            channel.messages.append(message)
            self.posts.append(message)
        answer: dict[str, Any] = {
            "channel": channel.id,
            "ts": message.ts,
            "message": message.as_slack(with_metadata=True),
        }
        warnings = warning.split(",") if warning else []
        messages = []
        if truncated:
            # Slack's answer (changelog "Truncating really long messages"): ok, the cut message,
            # and the warning at the top and in response_metadata.
            warnings.append("message_truncated")
            messages.append(
                "[WARN] Your message was truncated but still posted. The `text` field accepts "
                f"up to {self.text_limit:,} characters."
            )
        if warnings:
            answer["warning"] = ",".join(warnings)
            answer["response_metadata"] = {"warnings": warnings, "messages": messages}
        return _ok(answer)

    def _find(self, channel_id: str) -> Channel | None:
        if channel_id in self.channels:
            return self.channels[channel_id]
        name = channel_id.lstrip("#")
        return next((c for c in self.channels.values() if c.name == name), None)

    def _history(self, method: str, args: dict[str, Any], *, broken: bool) -> web.Response:
        channel_id = str(args.get("channel") or "")
        with self._lock:
            channel = self.channels.get(channel_id)  # history takes an ID, never a name
            if channel is None:
                return _fail("channel_not_found")
            if not channel.member:
                return _fail("not_in_channel")
            try:
                limit = int(args.get("limit") or 100)
                oldest = float(args.get("oldest") or 0)
                latest = float(args["latest"]) if args.get("latest") else float("inf")
            except ValueError:
                return _fail("invalid_arguments")
            if self._history_limit is not None:
                limit = min(limit, self._history_limit[1])
            limit = max(1, min(limit, 999))
            inclusive = _truthy(args.get("inclusive"))
            with_metadata = _truthy(args.get("include_all_metadata"))
            now = time.monotonic()
            thread = str(args.get("ts") or "") if method == "conversations.replies" else None
            if method == "conversations.replies":
                parent = next((m for m in channel.messages if m.ts == thread), None)
                if parent is None:
                    return _fail("thread_not_found")
                pool = [m for m in channel.messages if m.ts == thread or m.thread_ts == thread]
            else:
                # The channel's timeline: top-level messages (replies stay in their thread).
                pool = [m for m in channel.messages if m.thread_ts in (None, m.ts)]
            shown = [
                m
                for m in pool
                if m.visible(now) and _within(float(m.ts), oldest, latest, inclusive)
            ]
            for message in pool:  # this read counts against each hidden message
                if message.hidden_reads > 0:
                    message.hidden_reads -= 1
            newest_first = method == "conversations.history"
            shown.sort(key=lambda m: float(m.ts), reverse=newest_first)
            start = 0
            cursor = args.get("cursor")
            if cursor:
                try:
                    after = base64.b64decode(str(cursor)).decode().removeprefix("next_ts:")
                    start = next(
                        i
                        for i, m in enumerate(shown)
                        if (float(m.ts) < float(after)) == newest_first and m.ts != after
                    )
                except (ValueError, StopIteration, UnicodeDecodeError):
                    return _fail("invalid_cursor")
            page = shown[start : start + limit]
            more = start + limit < len(shown)
        body: dict[str, Any] = {
            "messages": [m.as_slack(with_metadata=with_metadata) for m in page],
            "has_more": more,
        }
        if method == "conversations.history":
            body["pin_count"] = 0
        next_cursor = ""
        if more and not broken:
            next_cursor = base64.b64encode(f"next_ts:{page[-1].ts}".encode()).decode()
        if broken:
            body["has_more"] = True
        body["response_metadata"] = {"next_cursor": next_cursor}
        return _ok(body)


def _within(ts: float, oldest: float, latest: float, inclusive: bool) -> bool:
    if inclusive:
        return oldest <= ts <= latest
    return oldest < ts < latest


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


async def _arguments(request: web.Request) -> dict[str, Any]:
    args: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                body = None
            if isinstance(body, dict):
                args.update(body)
        else:
            form = await request.post()
            args.update({key: value for key, value in form.items() if isinstance(value, str)})
    return args


def _ok(body: dict[str, Any]) -> web.Response:
    return web.json_response({"ok": True, **body})


def _fail(error: str, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"ok": False, "error": error}, status=status, headers=headers)


def _unavailable(status: int) -> web.Response:
    """An HTTP error with an HTML body, as a proxy in front of Slack answers."""
    return web.Response(
        status=status,
        text="<html><body>upstream unavailable</body></html>",
        content_type="text/html",
    )
