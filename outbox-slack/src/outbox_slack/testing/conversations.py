"""Slack's conversations as :class:`~outbox_slack.testing.server.SlackTestServer` holds them:
its identities, the messages and channels, Slack's answer and error shapes, and the pages of
``conversations.history`` and ``conversations.replies`` (``cursor``, ``limit``, ``oldest``,
``latest``, ``inclusive``, ``include_all_metadata``; messages hidden for a while)."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from outbox_core.testing.loopback_http import Answer, Received

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
METHODS = ("auth.test", "chat.postMessage", "conversations.history", "conversations.replies")
READS = ("auth.test", "conversations.history", "conversations.replies")
"""What a read-back calls: what an outage (:meth:`SlackTestServer.outage`) makes unreadable."""


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


def ok(body: dict[str, Any]) -> dict[str, Any]:
    """Slack's answer to a call it carried out."""
    return {"ok": True, **body}


def refused(error: str) -> dict[str, Any]:
    """Slack's body for a call it refused."""
    return {"ok": False, "error": error}


def fail(error: str, *, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """Slack's answer to a call it refused: ``{"ok": false, "error": error}``."""
    return Answer(status, refused(error), headers)


def unavailable(status: int) -> Answer:
    """An HTTP error with an HTML body, as a proxy in front of Slack answers."""
    return Answer(
        status,
        "<html><body>upstream unavailable</body></html>",
        content_type="text/html; charset=utf-8",
    )


def posted(message: Message, warning: str | None, cut_at: int | None) -> dict[str, Any]:
    """``chat.postMessage``'s answer for ``message``, with ``warning`` (comma-separated ones)
    and, when its text was cut at ``cut_at`` characters, Slack's ``message_truncated``
    (changelog "Truncating really long messages": ok, the cut message, and the warning at the
    top and in ``response_metadata``)."""
    answer: dict[str, Any] = {
        "channel": message.channel,
        "ts": message.ts,
        "message": message.as_slack(with_metadata=True),
    }
    warnings = warning.split(",") if warning else []
    messages = []
    if cut_at is not None:
        warnings.append("message_truncated")
        messages.append(
            "[WARN] Your message was truncated but still posted. The `text` field accepts "
            f"up to {cut_at:,} characters."
        )
    if warnings:
        answer["warning"] = ",".join(warnings)
        answer["response_metadata"] = {"warnings": warnings, "messages": messages}
    return answer


def arguments(request: Received) -> dict[str, Any]:
    """A Web API call's arguments: its query string, and a form or JSON body."""
    args: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.raw:
        if request.content_type == "application/json":
            try:
                body = request.json()
            except ValueError:
                body = None
            if isinstance(body, dict):
                args.update(body)
        else:
            form = parse_qs(request.raw.decode(errors="replace"), keep_blank_values=True)
            args.update({key: values[-1] for key, values in form.items()})
    return args


def history_page(
    channel: Channel | None,
    method: str,
    args: dict[str, Any],
    *,
    page_max: int | None,
    broken: bool,
) -> dict[str, Any]:
    """``conversations.history`` (newest first) or ``conversations.replies`` (oldest first) of
    ``channel`` (None: not found) as Slack pages it; ``page_max``: the most messages a page
    (Slack's limit outside its Marketplace); ``broken``: ``has_more`` without a cursor. Counts
    the read against each hidden message; call it under the server's lock."""
    if channel is None:
        raise fail("channel_not_found")
    if not channel.member:
        raise fail("not_in_channel")
    try:
        limit = int(args.get("limit") or 100)
        oldest = float(args.get("oldest") or 0)
        latest = float(args["latest"]) if args.get("latest") else float("inf")
    except ValueError:
        raise fail("invalid_arguments") from None
    if page_max is not None:
        limit = min(limit, page_max)
    limit = max(1, min(limit, 999))
    inclusive = _truthy(args.get("inclusive"))
    with_metadata = _truthy(args.get("include_all_metadata"))
    now = time.monotonic()
    thread = str(args.get("ts") or "") if method == "conversations.replies" else None
    if method == "conversations.replies":
        parent = next((m for m in channel.messages if m.ts == thread), None)
        if parent is None:
            raise fail("thread_not_found")
        pool = [m for m in channel.messages if m.ts == thread or m.thread_ts == thread]
    else:
        # The channel's timeline: top-level messages (replies stay in their thread).
        pool = [m for m in channel.messages if m.thread_ts in (None, m.ts)]
    shown = [m for m in pool if m.visible(now) and _within(float(m.ts), oldest, latest, inclusive)]
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
            raise fail("invalid_cursor") from None
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
    return body


def _within(ts: float, oldest: float, latest: float, inclusive: bool) -> bool:
    if inclusive:
        return oldest <= ts <= latest
    return oldest < ts < latest


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")
