"""What a producer asks for: :class:`ActionRequest`, and what enqueue answers; and the checks
of its text and JSON that PostgreSQL would otherwise refuse with an error naming no field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

MAX_TEXT_BYTES = 1000
"""The longest lane key, idempotency key, workspace or subject, in UTF-8 bytes. Each is in a
btree index, whose rows PostgreSQL caps at 2704 bytes (a longer value that compresses well would
pass, a random one not): a fixed bound that every value meets, far above any real key."""

MAX_ATTEMPTS = 2**31 - 1
"""``max_attempts`` is an ``integer`` column."""

_INT_BITS = 12_950  # about 3900 decimal digits: below Python's int-to-str limit (4300)


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One effect to carry out once the caller's transaction commits.

    ``payload`` is a model instance of the kind's variants or a plain JSON object; keep it to
    identifiers where the adapter can read the rest. ``max_attempts`` defaults to the kind's
    ``default_max_attempts``. ``not_before`` delays the first attempt.
    """

    kind: str
    lane_key: str
    idempotency_key: str
    payload: BaseModel | Mapping[str, Any] = field(default_factory=dict)
    workspace_id: str | None = None
    subject_account_id: str | None = None
    max_attempts: int | None = None
    expires_at: datetime | None = None
    not_before: datetime | None = None
    proposed: bool = False


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The action that holds the request's idempotency key, and whether this call made it."""

    id: int
    created: bool


def text_problem(value: str, *, limit: int | None = MAX_TEXT_BYTES) -> str | None:
    """Why PostgreSQL's ``text`` (or ``jsonb``) would refuse ``value``, or None. Never the value:
    it may be personal data."""
    if "\x00" in value:
        return (
            f"holds a NUL character (U+0000) at position {value.index(chr(0))}, which "
            "PostgreSQL's text and jsonb refuse"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"holds a lone surrogate at position {exc.start}: not valid Unicode text"
    if limit is not None and size > limit:
        return f"is {size} bytes long in UTF-8; at most {limit}"
    return None


def json_problem(value: Any, path: str = "payload") -> tuple[str, str] | None:
    """(where, why) for the first part of ``value`` that is not a JSON value PostgreSQL's
    ``jsonb`` keeps as it is, or None: an object key that is not a string, a string with a NUL
    character or a lone surrogate, a number that is not finite or would come back as another
    number, a value of another type. The message names the place (``payload.items[2]``) and
    never the value."""
    try:
        if clean_json(value):  # the common case, without building paths
            return None
    except RecursionError:
        pass
    todo: list[tuple[str, Any]] = [(path, value)]
    while todo:
        where, item = todo.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if item.bit_length() > _INT_BITS:
                return where, "an integer of more than 3900 digits cannot be written as JSON"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return where, f"{item} is not a JSON number"
            if item.is_integer() and abs(item) >= 1e16:
                # Written as 1e+16, read back from jsonb as the integer 10000000000000000.
                return where, "a float with no fraction of 1e16 or more comes back as an int"
        elif isinstance(item, str):
            problem = text_problem(item, limit=None)
            if problem is not None:
                return where, f"the string {problem}"
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return where, f"has a key of type {type(key).__name__}; JSON keys are strings"
                problem = text_problem(key, limit=None)
                if problem is not None:
                    return where, f"has a key that {problem}"
                todo.append((f"{where}{key_segment(key)}", sub))
        elif isinstance(item, list | tuple):
            todo.extend((f"{where}[{index}]", sub) for index, sub in enumerate(item))
        else:
            return where, f"a {type(item).__name__} is not a JSON value"
    return None


def key_segment(key: object) -> str:
    """A payload path's step into ``key`` for a one-line message: ``.note``, ``[2]``, or a key
    that is long or not printable as ``['a\\nb...']``."""
    if isinstance(key, int):
        return f"[{key}]"
    text = str(key)
    if text.isprintable() and 0 < len(text) <= 40 and not any(c in text for c in " .[]'"):
        return f".{text}"
    shown = text if len(text) <= 40 else text[:40] + "..."
    return f"[{shown!r}]"


def clean_json(item: Any) -> bool:
    """Whether ``item`` surely passes :func:`json_problem` (exact built-in types only: anything
    else, and every problem, is left to its walk, which names the place)."""
    kind = type(item)
    if kind is str:
        return "\x00" not in item and (item.isascii() or _encodes(item))
    if kind is dict:
        for key, sub in item.items():
            if type(key) is not str or "\x00" in key or not (key.isascii() or _encodes(key)):
                return False
            if not clean_json(sub):
                return False
        return True
    if kind is list or kind is tuple:
        return all(clean_json(sub) for sub in item)
    if kind is int:
        return bool(item.bit_length() <= _INT_BITS)
    if kind is float:
        return math.isfinite(item) and not (item.is_integer() and abs(item) >= 1e16)
    return item is None or kind is bool


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
