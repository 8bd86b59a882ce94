"""Finding actions: a filter, a bounded page, newest first, and a cursor for the next one.

``outbox actions`` and the dashboard's search call :func:`find_actions` (or its async twin);
the statement is ``find_actions`` in ``sql/search.sql``, which says how a filter becomes one
walk of one index.

The cost of a page is bounded on any table size. The walk follows the index of the filter's
most selective indexed field (:data:`DRIVING_ORDER`) in id order from the cursor, or the
primary key when the filter names none of them; the other fields filter the rows the walk
reaches, and a page reads at most :data:`CANDIDATE_WINDOW` of them. A page that ran out of its
window before it was full says so (:attr:`Page.more_may_match`): its cursor goes on below the
window, and a narrower filter (an indexed field) answers in fewer pages.

A cursor is opaque: the id the next page starts below, and a fingerprint of the filter that
made it, so that a cursor reused with another filter is refused instead of paging wrongly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection

from .action import Action
from .adapter import KIND_NAME
from .errors import InvalidFilter
from .outbox import Outbox
from .sqlfiles import package_queries
from .states import ActionState
from .steps import Query, Steps, arun, run

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# The most rows of its walk one page reads (see sql/search.sql): about 5 ms of a warm table.
CANDIDATE_WINDOW = 10_000

# The fields with an index in id order (migration 0019), most selective first: the first one a
# filter names drives the walk. A key prefix drives it only while it matches no more than the
# window (its index is in key order): see find_steps.
DRIVING_ORDER = ("key", "lane_key", "subject", "key_prefix", "workspace", "kind")

_TEXT_FIELDS = ("kind", "stop_reason", "lane_key", "key", "key_prefix", "subject", "workspace")
_TIME_FIELDS = ("created_since", "created_until", "ended_since", "ended_until")
_MAX_TEXT = 1000
_NO_CURSOR = 2**63 - 1  # above every bigint id


@dataclass(frozen=True, slots=True)
class ActionFilter:
    """What to find; every field given must hold (an AND). ``states``: any of them. Times are
    aware datetimes; ``*_since`` is inclusive, ``*_until`` exclusive. :class:`InvalidFilter`
    names the first wrong field; the empty filter finds every action."""

    kind: str | None = None
    states: Collection[str] = field(default=())
    stop_reason: str | None = None
    lane_key: str | None = None
    key: str | None = None
    key_prefix: str | None = None
    subject: str | None = None
    workspace: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None
    ended_since: datetime | None = None
    ended_until: datetime | None = None

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            _check_text(name, getattr(self, name))
        for name in ("kind", "stop_reason"):
            value = getattr(self, name)
            if value is not None and not KIND_NAME.match(value):
                raise InvalidFilter(
                    name, f"{value!r} is not a {name.replace('_', ' ')} (upper-case: EMAIL)"
                )
        if self.key is not None and self.key_prefix is not None:
            raise InvalidFilter("key_prefix", "give a key or a key prefix, not both")
        object.__setattr__(self, "states", _states(self.states))
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise InvalidFilter(
                    name, f"{value!r} is not a time with its offset (2026-12-03T10:00:00+00:00)"
                )
        for since, until in (("created_since", "created_until"), ("ended_since", "ended_until")):
            low, high = getattr(self, since), getattr(self, until)
            if low is not None and high is not None and low >= high:
                raise InvalidFilter(until, f"{high.isoformat()} is not after {since} {low}")

    def given(self) -> list[str]:
        """The names of the fields this filter sets, in declaration order."""
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, ())]

    def fingerprint(self) -> str:
        """A short digest of the filter, carried by its cursors."""
        values = {name: _plain(getattr(self, name)) for name in self.given()}
        text = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def params(self) -> dict[str, Any]:
        """The named parameters of the filter's conditions (sql/search.sql)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.given()}
        if "states" in out:
            out["states"] = [str(state) for state in self.states]
        if self.key_prefix is not None:
            out["key_prefix_end"] = _after_prefix(self.key_prefix)
        return out


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a search, newest first. ``next_cursor`` None: nothing further matches.
    ``more_may_match``: the page read its whole candidate window before it was full; more
    actions may match below it (``next_cursor`` goes on there), and a narrower filter finds
    them in fewer pages."""

    actions: tuple[Action, ...]
    next_cursor: str | None
    more_may_match: bool = False

    @property
    def note(self) -> str | None:
        """What a reader of the page is told about what it leaves out, if anything."""
        if self.more_may_match:
            return (
                f"more may match: this page read its {CANDIDATE_WINDOW:,} candidates; narrow "
                "the filter (kind, lane, key, key prefix, subject, workspace) or go on with "
                "the cursor"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (no payloads: they may hold personal data)."""
        return {
            "actions": [action.as_dict() for action in self.actions],
            "next_cursor": self.next_cursor,
            "more_may_match": self.more_may_match,
            "note": self.note,
        }


def filter_from_text(values: Mapping[str, str | Sequence[str] | None]) -> ActionFilter:
    """An :class:`ActionFilter` from text, as a command line or a form gives it: the field names
    as keys, ``states`` one text or several, each of them comma-separated (``FAILED,UNCERTAIN``),
    times in ISO 8601 with their offset (``2026-12-03T10:00:00Z``); None leaves a field out."""
    texts: dict[str, Any] = {}
    for name, value in values.items():
        if name == "states":
            parts = [value] if isinstance(value, str) else list(value or ())
            texts[name] = [state.strip() for part in parts for state in part.split(",")]
        elif name in _TIME_FIELDS:
            texts[name] = None if value is None else parse_time(name, str(value))
        else:
            texts[name] = value
    return ActionFilter(**texts)


def parse_time(field_name: str, text: str) -> datetime:
    """A time in ISO 8601 with its offset; :class:`InvalidFilter` names ``field_name``."""
    try:
        moment: datetime | None = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise InvalidFilter(
            field_name, f"{text!r} is not a time with its offset (2026-12-03T10:00:00Z, ...+01:00)"
        )
    return moment


def parse_limit(text: str) -> int:
    """A page size given as text; :class:`InvalidFilter` for one that is not a whole number
    (find_steps checks the range)."""
    try:
        return int(text)
    except ValueError:
        raise InvalidFilter("limit", f"{text!r} is not a page size from 1 to {MAX_LIMIT}") from None


def find_steps(
    outbox: Outbox,
    action_filter: ActionFilter | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Steps[Page]:
    """:func:`find_actions` as steps (:mod:`outbox_core.steps`)."""
    action_filter = action_filter if action_filter is not None else ActionFilter()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidFilter("limit", f"{limit!r} is not a page size from 1 to {MAX_LIMIT}")
    fingerprint = action_filter.fingerprint()
    before = _NO_CURSOR if cursor is None else decode_cursor(cursor, fingerprint)
    queries = package_queries("outbox_core", "sql/search.sql", outbox.schema)
    params = {**action_filter.params(), "before": before, "window": CANDIDATE_WINDOW}
    given = action_filter.given()
    driving = next((name for name in DRIVING_ORDER if name in given), None)
    if driving == "key_prefix":
        rows = yield Query(_compose(queries, "key_prefix_size", ["key_prefix"], []), params)
        if rows[0][0] > CANDIDATE_WINDOW:
            driving = None
    drives = [driving] if driving is not None else []
    filtering = [name for name in given if name not in drives]
    rows = yield Query(
        _compose(queries, "find_actions", drives, filtering), {**params, "limit": limit + 1}
    )
    actions = tuple(Action.from_row(row) for row in rows[:limit])
    if len(rows) > limit:
        return Page(actions, encode_cursor(actions[-1].id, fingerprint))
    if not filtering:
        return Page(actions, None)
    # A short page: did the walk end, or only the window?
    (read, last_id), *_ = yield Query(_compose(queries, "window_end", drives, []), params)
    if read < CANDIDATE_WINDOW:
        return Page(actions, None)
    return Page(actions, encode_cursor(int(last_id), fingerprint), more_may_match=True)


def find_actions(
    conn: Connection[Any],
    outbox: Outbox,
    action_filter: ActionFilter | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """One page of the actions that ``action_filter`` matches, newest first, at most ``limit``
    (1 to :data:`MAX_LIMIT`), below ``cursor`` (a page's ``next_cursor`` under the same filter).
    :class:`InvalidFilter` names a wrong field, page size or cursor; nothing is written."""
    return run(conn, find_steps(outbox, action_filter, limit, cursor))


async def afind_actions(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_filter: ActionFilter | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page:
    """The async twin of :func:`find_actions`."""
    return await arun(conn, find_steps(outbox, action_filter, limit, cursor))


async def amatching_ids(
    conn: AsyncConnection[Any], outbox: Outbox, action_filter: ActionFilter, bound: int
) -> list[int]:
    """The ids of the actions that ``action_filter`` matches, newest first: every one of them,
    or ``bound + 1`` when more than ``bound`` match (so that the caller can refuse instead of
    acting on a part). Page after page of :func:`afind_actions` at :data:`MAX_LIMIT`, so each
    statement stays bounded; a filter that names no indexed field reads the table window by
    window until it has its ids or reaches the end."""
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise InvalidFilter("bound", f"{bound!r} is not a number of actions from 1")
    ids: list[int] = []
    cursor: str | None = None
    while len(ids) <= bound:
        page = await afind_actions(conn, outbox, action_filter, MAX_LIMIT, cursor)
        ids.extend(action.id for action in page.actions)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return ids[: bound + 1]


def encode_cursor(before: int, fingerprint: str) -> str:
    """The opaque cursor of the page that starts below ``before`` under a filter."""
    raw = json.dumps([before, fingerprint], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, fingerprint: str) -> int:
    """The id a cursor's page starts below; :class:`InvalidFilter` for a cursor that is not one
    of ours, or that another filter made."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        before, made_by = json.loads(raw)
        valid = isinstance(before, int) and 1 <= before <= _NO_CURSOR and isinstance(made_by, str)
    except (binascii.Error, ValueError, TypeError):
        valid = False
    if not valid:
        raise InvalidFilter("cursor", f"{cursor[:40]!r} is not a cursor that a search gave")
    if made_by != fingerprint:
        raise InvalidFilter(
            "cursor",
            "it belongs to a search with another filter: repeat that filter to go on with it, "
            "or start this search without a cursor",
        )
    return int(before)


def _compose(queries: dict[str, str], name: str, driving: list[str], filtering: list[str]) -> str:
    def conditions(names: list[str]) -> str:
        return "\n".join(queries[f"when_{name}"] for name in names)

    text = queries[name].replace("{driving}", conditions(driving))
    return text.replace("{filtering}", conditions(filtering))


def _check_text(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidFilter(name, f"{value!r} is not text")
    if not value:
        raise InvalidFilter(name, "empty; leave the field out to match every value")
    if len(value) > _MAX_TEXT or "\x00" in value:
        raise InvalidFilter(name, f"longer than {_MAX_TEXT} characters or holds a NUL")


def _states(values: Collection[str]) -> tuple[ActionState, ...]:
    if isinstance(values, str):
        values = (values,)
    known = {str(state): state for state in ActionState}
    found: list[ActionState] = []
    for value in values:
        state = known.get(str(value).upper()) if isinstance(value, str) else None
        if state is None:
            raise InvalidFilter(
                "states", f"{value!r} is not a state; the states: {', '.join(known)}"
            )
        if state not in found:
            found.append(state)
    return tuple(sorted(found))


def _plain(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [str(item) for item in value]
    return value


def _after_prefix(prefix: str) -> str:
    """The least string above every string that starts with ``prefix``, in code point order
    (the C collation's order of UTF-8 text)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not text
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    raise InvalidFilter("key_prefix", "a prefix of only U+10FFFF characters matches no key")
