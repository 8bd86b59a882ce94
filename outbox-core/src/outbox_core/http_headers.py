"""What an HTTP adapter reads from a provider's answer, whatever the provider: the wait a
``Retry-After`` header asks for, the time left until a rate limit resets, and the provider's
clock from its ``Date`` header (so that a time the provider names is not read against this
host's clock)."""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from datetime import timedelta

__all__ = ["provider_clock", "reset_wait", "retry_after"]


def provider_clock(date: str | None) -> float:
    """The provider's time (Unix seconds) from an answer's ``Date`` header, else this host's."""
    if date:
        try:
            return email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    return time.time()


def retry_after(value: str | None, *, date: str | None = None) -> timedelta | None:
    """The wait a ``Retry-After`` header asks for: delay-seconds (``"30"``, also ``"1.5"``), or
    an HTTP-date read against the answer's ``Date`` (:func:`provider_clock`).

    None when the header is absent or unreadable (the adapter's own default applies); a
    negative delay or a date in the past is no wait, ``timedelta(0)``."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = moment.timestamp() - provider_clock(date)
    return _wait(seconds)


def reset_wait(headers: Mapping[str, str]) -> timedelta | None:
    """The time left until a rate limit resets: ``x-ratelimit-reset`` (a Unix time, GitHub's
    and others', read against the answer's ``Date``: :func:`provider_clock`), else
    ``ratelimit-reset`` (seconds from now, the IETF draft's). A reset in the past is no wait,
    ``timedelta(0)``; None when neither header is there and readable."""
    try:
        seconds = float(headers.get("x-ratelimit-reset", "")) - provider_clock(headers.get("date"))
    except ValueError:
        return retry_after(headers.get("ratelimit-reset"))
    return _wait(seconds)


def _wait(seconds: float) -> timedelta | None:
    """``seconds`` as a wait: a negative one is no wait; None when it is not a finite number
    a ``timedelta`` holds."""
    if not math.isfinite(seconds):
        return None
    try:
        return timedelta(seconds=max(seconds, 0.0))
    except OverflowError:
        return None
