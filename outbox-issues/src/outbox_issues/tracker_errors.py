"""The failures of a request to the tracker, typed by what they prove (:class:`NotSent`,
:class:`Unanswered`, :class:`RateLimited`, :class:`Refused`, :class:`GraphQLRefused`), so an
adapter maps them to results in one place; what a detail keeps of the tracker's words
(:func:`said`); and GitHub's rate limits read from an answer (:func:`rate_limit`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox_core import retry_after
from outbox_core.http_headers import reset_wait
from outbox_core.http_results import HttpFailure, Proof

if TYPE_CHECKING:
    import httpx

SECONDARY_LIMIT_MINIMUM = 60.0
_SECONDARY_WORDS = ("secondary rate limit", "abuse detection")


class TrackerError(Exception):
    """A request to the tracker that did not succeed. ``detail`` is what the action keeps of
    it (outbox_core.results): the HTTP status and the tracker's own words about the failure
    (``"HTTP 422 Validation Failed"``), never a URL, the issue's content or a token; the
    message, for logs, names the request."""

    def __init__(
        self, message: str, *, status: int | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or (f"HTTP {status}" if status is not None else type(self).__name__)

    proof: Proof = Proof.UNANSWERED
    """What the failure proves in the core's mapping of a failed call to a result
    (``outbox_core.http_results``; any failure not typed below may have taken effect)."""

    @property
    def failure(self) -> HttpFailure:
        """This failure as the core's mapping reads it."""
        return HttpFailure(self.proof, self.detail, status=self.status)


# What a detail keeps of the tracker's message: its first sentence, without anything that may
# name a person, a place or a secret (an address, a URL or path, an IP, a long number: "API
# rate limit exceeded for user ID 1234").
_UNSAFE = re.compile(r"\S*[@/\\:]\S*|\d+(?:\.\d+){3}|\d{4,}")
# A GraphQL error's type (NOT_FOUND), or its extensions' code when it has none
# (undefinedField: a schema without the field asked for).
_GRAPHQL_TYPE = re.compile(r"[A-Za-z][A-Za-z_]{0,40}")


def said(message: str) -> str:
    """The tracker's words as a detail keeps them (see ``_UNSAFE``), at most 80 characters."""
    first = message.strip().split(". ")[0].rstrip(".")
    return " ".join(_UNSAFE.sub("\u2026", first).split())[:80]


def http_detail(status: int, message: str) -> str:
    """``"HTTP 404 Not Found"``: the status and the tracker's words (``said``)."""
    words = said(message)
    return f"HTTP {status} {words}" if words else f"HTTP {status}"


class NotSent(TrackerError):
    """The request never reached the tracker (connection refused, connect timeout, no pool
    slot): it holds nothing from it."""

    proof = Proof.NOT_SENT


class Unanswered(TrackerError):
    """The request was sent and no usable answer came back (a timeout, a dropped connection,
    a 5xx): it may have taken effect."""


class RateLimited(TrackerError):
    """A primary limit (``x-ratelimit-remaining: 0``, wait until ``x-ratelimit-reset``) or a
    secondary one (its message says so; ``retry-after``, or at least a minute). Nothing was
    written."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        wait_seconds: float,
        secondary: bool,
        detail: str | None = None,
    ) -> None:
        which = "secondary" if secondary else "primary"
        super().__init__(
            message, status=status, detail=detail or f"HTTP {status} {which} rate limit"
        )
        self.wait_seconds = wait_seconds
        self.secondary = secondary

    proof = Proof.LIMITED

    @property
    def failure(self) -> HttpFailure:
        return HttpFailure(
            self.proof, self.detail, status=self.status, wait=timedelta(seconds=self.wait_seconds)
        )


class Refused(TrackerError):
    """A 4xx that is not a rate limit: the tracker refused the request (401, 403, 404, 410,
    422 ...). ``errors`` holds a 422's validation errors."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        errors: Sequence[Any] = (),
        documentation_url: str | None = None,
        location: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, status=status, detail=detail)
        self.errors = list(errors)
        self.documentation_url = documentation_url
        self.location = location

    proof = Proof.REFUSED


class GraphQLRefused(TrackerError):
    """GraphQL answered (HTTP 200) with ``errors``; ``types`` holds their ``type`` fields
    (``NOT_FOUND``, ``FORBIDDEN``, ...), or the ``extensions.code`` of one without a type
    (``undefinedField``). ``RATE_LIMITED`` raises :class:`RateLimited`."""

    def __init__(self, message: str, *, types: Sequence[str]) -> None:
        named = [kind for kind in types if _GRAPHQL_TYPE.fullmatch(kind)]
        super().__init__(
            message, status=200, detail=f"GraphQL {', '.join(named) if named else 'errors'}"
        )
        self.types = list(types)


def error_type(error: Any) -> str:
    """A GraphQL error's ``type``, else its ``extensions.code`` (GitHub's schema errors, such
    as ``undefinedField``, carry no type), else ""."""
    if not isinstance(error, dict):
        return ""
    extensions = error.get("extensions")
    code = extensions.get("code") if isinstance(extensions, dict) else None
    return str(error.get("type") or code or "")


def until_reset(response: httpx.Response) -> float | None:
    """Seconds until ``x-ratelimit-reset`` (a Unix time), read against the tracker's clock
    (its ``Date`` header), not this host's (:func:`outbox_core.http_headers.reset_wait`); None
    without a readable header."""
    wait = reset_wait(response.headers)
    return None if wait is None else wait.total_seconds()


def rate_limit(response: httpx.Response, message: str) -> RateLimited | None:
    """The rate limit a 403 or 429 reports, or None when it reports none.

    Every REST answer carries ``x-ratelimit-*`` headers, so their presence proves nothing:
    a primary limit says ``x-ratelimit-remaining: 0``; a secondary one says so in its message
    (``You have exceeded a secondary rate limit``) or sends ``retry-after``."""
    status = response.status_code
    if status not in (403, 429):
        return None
    headers = response.headers
    asked = retry_after(headers.get("retry-after"), date=headers.get("date"))
    retry_after_seconds = None if asked is None else asked.total_seconds()
    if headers.get("x-ratelimit-remaining") == "0":
        until = until_reset(response)
        wait = until if until is not None else SECONDARY_LIMIT_MINIMUM
        if retry_after_seconds is not None:
            wait = max(wait, retry_after_seconds)
        return RateLimited(
            f"primary rate limit ({headers.get('x-ratelimit-resource', 'core')}): {message}",
            status=status,
            wait_seconds=max(1.0, wait + 1.0),
            secondary=False,
        )
    lowered = message.lower()
    if retry_after_seconds is not None or any(words in lowered for words in _SECONDARY_WORDS):
        wait = retry_after_seconds if retry_after_seconds is not None else SECONDARY_LIMIT_MINIMUM
        return RateLimited(
            f"secondary rate limit: {message}",
            status=status,
            wait_seconds=max(1.0, wait),
            secondary=True,
        )
    if status == 429:
        return RateLimited(
            f"429 without limit headers: {message}",
            status=status,
            wait_seconds=SECONDARY_LIMIT_MINIMUM,
            secondary=True,
        )
    return None
