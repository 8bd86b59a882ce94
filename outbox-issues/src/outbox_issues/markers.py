"""Markers: hidden HTML comments in issue and comment bodies that name the action that wrote
them, so an attempt after an unknown write finds that write by listing, never by guessing.

GitHub renders Markdown and drops HTML comments, so readers never see them; the API returns
the body as written. Text from a person never carries a marker: :func:`inert` breaks every
``<!--`` in it, so a report cannot forge an action's marker or end the reporter's section.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

PREFIX = "outbox"
TEXT_BEGIN = f"<!-- {PREFIX}:reporter-text:begin -->"
TEXT_END = f"<!-- {PREFIX}:reporter-text:end -->"
SCRUBBED = "_The reporter's text was removed at their request._"
_SECTION = re.compile(re.escape(TEXT_BEGIN) + r".*?" + re.escape(TEXT_END), re.S)


def action_marker(idempotency_key: str) -> str:
    """The marker of one action's write: its idempotency key, which names it."""
    return f"<!-- {PREFIX}:action {inert_key(idempotency_key)} -->"


def quote_marker(report_id: str) -> str:
    """The marker of a comment of this package that quotes the reporter's text: the scrub
    after an erasure deletes every comment that carries it."""
    return f"<!-- {PREFIX}:quote {inert_key(report_id)} -->"


def content_marker(report_id: str, generation: int, digest: str) -> str:
    """What a publish reads back: the generation and a digest of the title, body and labels."""
    return f"<!-- {PREFIX}:content {inert_key(report_id)} {generation} {digest} -->"


def inert_key(value: str) -> str:
    """A key as it may stand in a comment: no ``--`` and no ``>``."""
    return value.replace("-->", "").replace("--", "-").replace(">", "")


def inert(text: str) -> str:
    """A person's text that cannot open an HTML comment (so it holds no marker)."""
    return text.replace("<!--", "&lt;!--")


def digest(title: str, body: str, labels: Iterable[str]) -> str:
    joined = "\x1f".join([title, body, *sorted(labels)])
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def has_marker(body: str | None, marker: str) -> bool:
    return body is not None and marker in body


def reporter_section(text: str) -> str:
    """The reporter's text between the two markers a scrub looks for, whole (what GitHub
    cannot take whole is refused at enqueue: :mod:`outbox_issues.limits`)."""
    return f"{TEXT_BEGIN}\n{inert(text)}\n{TEXT_END}"


def scrub(body: str) -> tuple[str, bool]:
    """The body with every reporter section replaced by a notice; and whether it changed."""
    scrubbed, count = _SECTION.subn(f"{TEXT_BEGIN}\n{SCRUBBED}\n{TEXT_END}", body)
    return scrubbed, count > 0 and scrubbed != body


def holds_reporter_text(body: str | None) -> bool:
    """Whether a body still has a reporter section that is not the scrub's notice."""
    if body is None:
        return False
    return any(
        match.group(0) != f"{TEXT_BEGIN}\n{SCRUBBED}\n{TEXT_END}"
        for match in _SECTION.finditer(body)
    )
