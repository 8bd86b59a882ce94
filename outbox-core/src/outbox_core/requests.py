"""What a producer asks for: :class:`ActionRequest`, and what enqueue answers; and the checks
of its text and JSON that PostgreSQL would otherwise refuse with an error naming no field."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

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


class Enqueued(NamedTuple):
    """The action that holds the request's idempotency key, and whether this call made it.

    A named tuple (``action_id, created = outbox.enqueue(...)`` works too): a bulk enqueue
    returns one per request, and a tuple of an int and a bool costs less to make than a frozen
    dataclass and leaves the garbage collector's tracking at its first pass."""

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


_LEFT = "\x00left"
"""The walk's marker of a container left (no path has a NUL character: keys with one are
refused before their path is made)."""


def json_problem(value: Any, path: str = "payload") -> tuple[str, str] | None:
    """(where, why) for the first part of ``value`` that is not a JSON value PostgreSQL's
    ``jsonb`` keeps as it is, or None: an object key that is not a string, a string with a NUL
    character or a lone surrogate, a number that is not finite or would come back as another
    number, a value of another type. The message names the place (``payload.items[2]``) and
    never the value."""
    if clean_json(value):  # the common case, without building paths
        return None
    # Depth first, with the containers on the current path (a container met again below
    # itself is a cycle, which json.dumps refuses and a walk without this never leaves; one
    # met again beside itself is only shared, and fine). _LEFT marks where a container's
    # items end: popped after all of them, it takes the container off the path.
    todo: list[tuple[str, Any]] = [(path, value)]
    on_path: set[int] = set()
    while todo:
        where, item = todo.pop()
        if where is _LEFT:
            on_path.discard(item)
            continue
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, Mapping | list | tuple):
            if id(item) in on_path:
                return where, "holds itself (a cycle), which JSON cannot write"
            on_path.add(id(item))
            todo.append((_LEFT, id(item)))
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
    else, every problem, and a value nested deeper than Python's recursion limit or holding
    itself, is left to its walk, which names the place)."""
    try:
        return _clean(item)
    except RecursionError:
        return False


def _clean(item: Any) -> bool:
    kind = type(item)
    if kind is str:
        return "\x00" not in item and (item.isascii() or _encodes(item))
    if kind is dict:
        for key, sub in item.items():
            if type(key) is not str or "\x00" in key or not (key.isascii() or _encodes(key)):
                return False
            if not _clean(sub):
                return False
        return True
    if kind is list or kind is tuple:
        return all(map(_clean, item))
    if kind is int:
        return bool(item.bit_length() <= _INT_BITS)
    if kind is float:
        return math.isfinite(item) and not (item.is_integer() and abs(item) >= 1e16)
    return item is None or kind is bool


_JSON_TYPES = frozenset({dict, list, tuple, str, int, float, bool, type(None)})


def clean_json_many(values: list[Any]) -> bool:
    """Whether every one of ``values`` surely passes :func:`json_problem`, as :func:`clean_json`
    decides for one, but a level at a time across all of them: each level's keys and values
    are gathered by type and checked in passes that run in C (a join, a ``max``), instead of a
    Python call per value. False when one may not pass (the caller then walks them one by one,
    which names the place): another type than the exact built-in ones, a level deeper than
    Python's recursion limit (where :func:`clean_json` gives up too, and where a cycle leads)."""
    level = values
    for _ in range(sys.getrecursionlimit()):
        if not level:
            return True
        kinds = set(map(type, level))
        if not kinds <= _JSON_TYPES:
            return False
        below: list[Any] = []
        for kind in kinds:
            same: list[Any] = (
                level if len(kinds) == 1 else [item for item in level if type(item) is kind]
            )
            if kind is dict:
                keys = list(itertools.chain.from_iterable(same))
                # Exact str keys, as clean_json asks (the join below takes str subclasses too).
                if not set(map(type, keys)) <= {str} or not _clean_texts(keys):
                    return False
                below.extend(itertools.chain.from_iterable(map(dict.values, same)))
            elif kind is list or kind is tuple:
                below.extend(itertools.chain.from_iterable(same))
            elif kind is str:
                if not _clean_texts(same):
                    return False
            elif kind is int:
                if max(map(int.bit_length, same)) > _INT_BITS:
                    return False
            elif kind is float and (
                # Every float of 1e16 or more has no fraction (2**53 < 1e16): see json_problem.
                not all(map(math.isfinite, same)) or max(map(abs, same)) >= 1e16
            ):
                return False
        level = below
    return False


def _clean_texts(texts: list[Any]) -> bool:
    """Whether every one of ``texts`` is a string without NUL that encodes as UTF-8 (a key of
    another type makes the join fail)."""
    try:
        joined = "".join(texts)
    except TypeError:
        return False
    return "\x00" not in joined and (joined.isascii() or _encodes(joined))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
