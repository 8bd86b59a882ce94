"""Slack's Web API as :class:`outbox_slack.adapter.SlackPostAdapter` meets it: the libraries
(imported when the adapter is built, never when the plugin is loaded), the clients of one event
loop, and what Slack's answers mean (the stop reasons, the errors after which a post may exist or
was not taken, the warnings that say a message was altered).

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
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from outbox_core import retry_after

from .settings import SlackSettings

if TYPE_CHECKING:
    from slack_sdk.web.async_client import AsyncWebClient

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

# Slack's error codes ("channel_not_found"), and the exception names of failed calls.
SLACK_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,63}")


_libs: tuple[ModuleType, ModuleType, ModuleType] | None = None


_SDK_LOGGER = logging.getLogger("outbox_slack.slack_sdk")
_SDK_LOGGER.setLevel(logging.WARNING)


def slack_libraries() -> tuple[ModuleType, ModuleType, ModuleType]:
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
class SlackAnswer:
    """What a Slack call came back with, when it came back at all."""

    status: int
    error: str | None
    retry_after: float | None

    def detail(self) -> str:
        """A result's detail: Slack's error code (``"Slack channel_not_found"``), with the HTTP
        status when it is not 200, or the status alone; an error that does not look like one
        of Slack's codes is not kept (a proxy's page, say)."""
        if self.error is not None and SLACK_CODE.fullmatch(self.error):
            if self.status in (0, 200):
                return f"Slack {self.error}" if self.status else self.error
            return f"Slack {self.error} (HTTP {self.status})"
        return f"HTTP {self.status} without a Slack answer"


def answer_of(exc: Any) -> SlackAnswer:
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
    return SlackAnswer(status, str(error) if error is not None else None, seconds)


def warnings_of(response: Any) -> list[str]:
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
            name if SLACK_CODE.fullmatch(name) else "unrecognised"
            for name in found - REQUEST_WARNINGS
            if name
        }
    )


class SlackClients:
    """One aiohttp session and two Web API clients on it, in one event loop."""

    def __init__(self, settings: SlackSettings, token: str) -> None:
        aiohttp, async_client, _ = slack_libraries()
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
