"""Requests checked against their kinds, and what the enqueue statements read.

Longer than 450 lines on purpose: a request's checks and the columns the statements read are
one contract, field by field (what a column may hold is what its check lets through, and a
batch's column check must refuse what the one-request check refuses); kept together, a new
field is one edit in one file.

``enqueue`` sends its request as one JSON array and ``enqueue_many`` its batch as one JSON
document of columns (``sql/queries.sql``): one parameter for psycopg to adapt and one call of
the JSON encoder, where a parameter per field cost psycopg a dumper each and a batch's rows cost
a list each (``docs/benchmarks.md``). A column is a list of one value per request, or one value
for the whole batch when every request has the same (the kind of a one-kind batch, its state,
its attempts, a workspace or subject shared by all, no ``not_before``): the statement reads
either, and a batch sends only what varies.

A batch is checked column by column (:func:`_clean_text`, and ``clean_json_many`` for the
payloads): when every value of a column surely passes, the requests are not walked one by one;
when one may not, they are, in order. Either
way a batch checks every request's kind, fields and JSON first, in request order (the first
request that fails raises, naming its first wrong field), and then each kind's payloads against
its variants, kind by kind: a later request's wrong field raises before an earlier request's
payload that its variants refuse (so did the batch before these columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, NamedTuple

from pydantic import BaseModel

from .adapter import ActionAdapter
from .errors import IdempotencyConflict, InvalidRequest, UnknownKind
from .registry import KindRegistry, RegisteredKind
from .requests import (
    MAX_ATTEMPTS,
    MAX_TEXT_BYTES,
    ActionRequest,
    Enqueued,
    clean_json,
    clean_json_many,
    json_problem,
    text_problem,
)
from .states import ActionState

_PROPOSED, _ADMITTED = str(ActionState.PROPOSED), str(ActionState.ADMITTED)
_REQUIRED_TEXT = ("lane_key", "idempotency_key")
_OPTIONAL_TEXT = ("workspace_id", "subject_account_id")


class Prepared(NamedTuple):
    """One request checked against its kind."""

    request: ActionRequest
    entry: RegisteredKind
    payload: dict[str, Any]
    """As stored (JSON)."""
    body: BaseModel
    """The payload decoded as the variant's model."""
    max_attempts: int


@dataclass(slots=True)
class PreparedBatch:
    """A batch checked against its kinds, kept as columns (a batch of 10,000 makes no object
    per request: each would be one more for the garbage collector to walk)."""

    requests: Sequence[ActionRequest]
    keys: list[str]
    """Each request's idempotency key, in request order."""
    entries: dict[str, RegisteredKind]
    payloads: list[dict[str, Any]]
    max_attempts: list[int] | int
    """One per request, or one for all."""
    bodies: list[BaseModel] | None
    """The payloads decoded, kept only when a kind of the batch has an enqueue check."""

    def checked(self) -> list[Prepared]:
        """The requests whose kind has an enqueue check, with what the check is handed."""
        if self.bodies is None:
            return []
        attempts = self.max_attempts
        return [
            Prepared(
                request,
                entry,
                payload,
                body,
                attempts if isinstance(attempts, int) else attempts[index],
            )
            for index, (request, payload, body) in enumerate(
                zip(self.requests, self.payloads, self.bodies, strict=True)
            )
            if (entry := self.entries[request.kind]).checks_enqueue
        ]


def checked_fields(
    request: ActionRequest,
    adapter: type[ActionAdapter],
    now: datetime | None,
    retention_days: float,
) -> int:
    """The request's own fields checked (InvalidRequest names the first wrong one); its
    ``max_attempts`` or the kind's default."""
    for name in ("lane_key", "idempotency_key", "workspace_id", "subject_account_id"):
        value = getattr(request, name)
        optional = name in _OPTIONAL_TEXT
        if value is None and optional:
            continue
        if not isinstance(value, str) or not (optional or value.strip()):
            raise InvalidRequest(
                name, "must be a string" if optional else "must be a non-empty string"
            )
        problem = text_problem(value)
        if problem is not None:
            raise InvalidRequest(name, problem)
    max_attempts = (
        request.max_attempts if request.max_attempts is not None else adapter.default_max_attempts
    )
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS
    ):
        raise InvalidRequest(
            "max_attempts",
            f"must be an integer from 1 to {MAX_ATTEMPTS}, got {max_attempts!r}",
        )
    if request.workspace_id is None and not adapter.instance_level:
        raise InvalidRequest(
            "workspace_id",
            f"{request.kind} is not an instance-level kind; name the workspace of the effect",
        )
    expires_at = request.expires_at
    if expires_at is None and request.not_before is None:
        return max_attempts
    for name, when in (("expires_at", expires_at), ("not_before", request.not_before)):
        if when is not None and (not isinstance(when, datetime) or when.tzinfo is None):
            raise InvalidRequest(name, "must be a timezone-aware datetime")
    if expires_at is not None and now is not None and expires_at <= now:
        raise InvalidRequest(
            "expires_at",
            f"{expires_at.isoformat()} has already passed (database time "
            f"{now.isoformat()}); an expired action would never run",
        )
    if expires_at is not None and now is not None and adapter.retained:
        # An ended action keeps its key for the retention, and no longer: a notice that
        # may still arrive after that would find no key and enqueue its effect again.
        retention = timedelta(days=retention_days)
        if expires_at > now + retention:
            raise InvalidRequest(
                "expires_at",
                f"{expires_at.isoformat()} is further out than the retention of "
                f"ended actions ({retention_days:g} days from database time "
                f"{now.isoformat()}, OUTBOX_RETENTION_DAYS): a late redelivery after the "
                "key was deleted would enqueue the effect again. Expire sooner, or raise "
                "the retention for every replica",
            )
    return max_attempts


def _stored(entry: RegisteredKind, request: ActionRequest) -> dict[str, Any]:
    """The request's payload as stored, or InvalidRequest naming where it is not JSON."""
    given = request.payload
    # A mapping is checked as the caller gave it, before encode() copies it (a path into a
    # payload that holds itself then names the caller's object, not the copy).
    misfit = json_problem(given) if isinstance(given, Mapping) else None
    if misfit is not None:
        raise InvalidRequest(*misfit)
    payload = entry.variants.encode(given)
    misfit = None if isinstance(given, Mapping) else json_problem(payload)
    if misfit is not None:
        raise InvalidRequest(*misfit)
    return payload


def prepare_one(
    registry: KindRegistry, request: ActionRequest, now: datetime | None, retention_days: float
) -> Prepared:
    """One request checked against its kind: its fields, its payload against the variants."""
    entry = registry.get(request.kind)
    max_attempts = checked_fields(request, entry.adapter, now, retention_days)
    payload = request.payload
    # A plain dict that is clean JSON is stored as it is; anything else goes through encode()
    # (a model is dumped, another mapping copied) and json_problem (which names the place).
    if type(payload) is not dict or not clean_json(payload) or entry.checks_enqueue:
        payload = _stored(entry, request)
    body = entry.variants.decode(payload, request.idempotency_key, kind=request.kind)
    return Prepared(request, entry, payload, body, max_attempts)


def prepare_batch(
    registry: KindRegistry,
    requests: Sequence[ActionRequest],
    now: datetime | None,
    retention_days: float,
) -> PreparedBatch:
    """A batch checked against its kinds: each request's fields (column by column while the
    columns are clean), then each kind's payloads against its variants in one validator call
    (``ActionVariants.decode_many``); in which order errors are found: the module's docstring."""
    try:
        entries = {kind: registry.get(kind) for kind in dict.fromkeys(r.kind for r in requests)}
        attempts = _clean_columns(requests, entries)
    except UnknownKind:
        attempts = None
    if attempts is None:
        # Request by request: the first wrong request, and in it the first wrong field, raises
        # (an unknown kind, a field, a payload that is not JSON).
        return _walked(registry, requests, now, retention_days)
    checked = any(entry.checks_enqueue for entry in entries.values())
    given: list[Any] = [request.payload for request in requests]
    if not checked and set(map(type, given)) == {dict} and clean_json_many(given):
        payloads: list[dict[str, Any]] = given  # plain dicts, stored as they are
    else:
        payloads = _stored_payloads(requests, entries, checked=checked)
    keys = _column(requests, "idempotency_key")
    bodies = _decoded(entries, requests, keys, payloads, keep=checked)
    return PreparedBatch(requests, keys, entries, payloads, attempts, bodies)


def _stored_payloads(
    requests: Sequence[ActionRequest], entries: dict[str, RegisteredKind], *, checked: bool
) -> list[dict[str, Any]]:
    """The payloads as stored, request by request (the first that is not JSON raises, naming the
    place): where the batch's payloads are not all plain dicts that surely pass together."""
    payloads: list[dict[str, Any]] = []
    append = payloads.append
    for request in requests:
        payload = request.payload
        # A plain dict goes as it is (json_problem checks it); a copy is made only for a kind
        # whose enqueue check is handed it, and for models and other mappings (encode()).
        if type(payload) is not dict or checked:
            payload = entries[request.kind].variants.encode(payload)
        if json_problem(payload) is not None:
            _stored(entries[request.kind], request)  # raises, naming the place
        append(payload)
    return payloads


def _walked(
    registry: KindRegistry,
    requests: Sequence[ActionRequest],
    now: datetime | None,
    retention_days: float,
) -> PreparedBatch:
    """:func:`prepare_batch` request by request: each request's kind, fields and payload in
    order, then the payloads against the variants."""
    entries: dict[str, RegisteredKind] = {}
    attempts: list[int] = []
    payloads: list[dict[str, Any]] = []
    for request in requests:
        entry = entries.get(request.kind)
        if entry is None:
            entry = entries[request.kind] = registry.get(request.kind)
        attempts.append(checked_fields(request, entry.adapter, now, retention_days))
        payloads.append(_stored(entry, request))
    checked = any(entry.checks_enqueue for entry in entries.values())
    keys = _column(requests, "idempotency_key")
    bodies = _decoded(entries, requests, keys, payloads, keep=checked)
    return PreparedBatch(requests, keys, entries, payloads, attempts, bodies)


def _decoded(
    entries: dict[str, RegisteredKind],
    requests: Sequence[ActionRequest],
    keys: list[str],
    payloads: list[dict[str, Any]],
    *,
    keep: bool,
) -> list[BaseModel] | None:
    """Each kind's payloads validated against its variants, one validator call a kind; the
    models kept (in request order) only when ``keep``."""
    if len(entries) == 1:
        ((kind, entry),) = entries.items()
        if not keep:
            entry.variants.check_many(payloads, keys, kind=kind)
            return None
        return entry.variants.decode_many(payloads, keys, kind=kind)
    found: dict[int, BaseModel] = {}
    for kind, entry in entries.items():
        indexes = [i for i, request in enumerate(requests) if request.kind == kind]
        these = [payloads[i] for i in indexes], [keys[i] for i in indexes]
        if not keep:
            entry.variants.check_many(*these, kind=kind)
            continue
        found.update(zip(indexes, entry.variants.decode_many(*these, kind=kind), strict=True))
    return [found[index] for index in range(len(requests))] if keep else None


def _clean_columns(
    requests: Sequence[ActionRequest], entries: dict[str, RegisteredKind]
) -> list[int] | int | None:
    """The batch's ``max_attempts`` (one for all when every request takes its kind's default
    and the batch has one kind) when its fields surely pass :func:`checked_fields`, found
    column by column; None when a request must be checked on its own (a value that may be
    wrong, or one the columns do not decide: an explicit ``max_attempts``, a time)."""
    for name in (*_REQUIRED_TEXT, *_OPTIONAL_TEXT):
        values = _column(requests, name)
        if not _clean_text(values, optional=name in _OPTIONAL_TEXT):
            return None
    for request in requests:
        if (
            request.max_attempts is not None
            or request.expires_at is not None
            or request.not_before is not None
        ):
            return None
    for kind, entry in entries.items():
        adapter = entry.adapter
        if not adapter.instance_level and any(
            request.workspace_id is None for request in requests if request.kind == kind
        ):
            return None
        default = adapter.default_max_attempts
        if isinstance(default, bool) or not isinstance(default, int):
            return None
        if not 1 <= default <= MAX_ATTEMPTS:
            return None
    if len(entries) == 1:
        ((entry),) = entries.values()
        return entry.adapter.default_max_attempts
    defaults = {kind: entry.adapter.default_max_attempts for kind, entry in entries.items()}
    return [defaults[request.kind] for request in requests]


def _clean_text(values: list[Any], *, optional: bool) -> bool:
    """Whether every value of a text column surely passes the request check (a string, not
    blank unless optional, no NUL, valid Unicode, at most ``MAX_TEXT_BYTES`` in UTF-8), decided
    in C-speed passes over the column; False when one may not (the caller then checks each)."""
    if optional:
        values = [value for value in values if value is not None]
        if not values:
            return True
    try:
        joined = "".join(values)
    except TypeError:
        return False  # a value that is not a string
    if "\x00" in joined:
        return False
    if not optional and not all(map(str.strip, values)):
        return False
    if joined.isascii():
        return max(map(len, values)) <= MAX_TEXT_BYTES
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return max(len(value.encode("utf-8")) for value in values) <= MAX_TEXT_BYTES


def distinct_keys(batch: PreparedBatch) -> int:
    """How many keys the batch holds; IdempotencyConflict when it uses one key for two
    different effects (a key repeated for the same effect is one request, answered twice)."""
    distinct = len(set(batch.keys))
    if distinct == len(batch.keys):  # no key repeated: nothing to compare
        return distinct
    seen: dict[str, ActionRequest] = {}
    for request in batch.requests:
        first = seen.setdefault(request.idempotency_key, request)
        if first is not request and (
            first.kind != request.kind or first.lane_key != request.lane_key
        ):
            raise IdempotencyConflict(
                "idempotency_key",
                f"{request.idempotency_key!r} is used twice in this batch for different "
                f"effects ({first.kind} in {first.lane_key!r}, {request.kind} in "
                f"{request.lane_key!r})",
            )
    return len(seen)


def request_row(prepared: Prepared, trace_context: dict[str, str] | None) -> list[Any]:
    """What the ``enqueue`` statement reads: one JSON array, the columns in the order
    ``REQUEST_COLUMNS`` gives (an array: a JSON object's keys cost the encoder as much again)."""
    request, adapter = prepared.request, prepared.entry.adapter
    due, expires = request.not_before, request.expires_at
    return [
        request.kind,
        adapter.at_most_once,
        adapter.instance_level,
        request.workspace_id,
        request.lane_key,
        request.idempotency_key,
        prepared.payload,
        request.subject_account_id,
        _PROPOSED if request.proposed else _ADMITTED,
        prepared.max_attempts,
        None if due is None else due.isoformat(),
        None if expires is None else expires.isoformat(),
        trace_context,
    ]


REQUEST_COLUMNS = (
    "kind",
    "at_most_once",
    "instance_level",
    "workspace_id",
    "lane_key",
    "idempotency_key",
    "payload",
    "subject_account_id",
    "state",
    "max_attempts",
    "due_at",
    "expires_at",
    "trace_context",
)
"""The ``enqueue`` statement's array, position by position (``r->>0`` is the kind)."""


def batch_document(batch: PreparedBatch) -> dict[str, Any]:
    """What the ``enqueue_many`` statement reads: one JSON object of columns, each a list in the
    caller's order or one value for all. ``key_order`` is each request's rank in the order the
    batch inserts (by key in code point order, which is UTF-8's byte order, a repeated key in
    the caller's order: ``sorted`` is stable), so that the server sorts integers, not text."""
    requests, keys = batch.requests, batch.keys
    ranks = [0] * len(keys)
    for rank, index in enumerate(sorted(range(len(keys)), key=keys.__getitem__), start=1):
        ranks[index] = rank
    if len(batch.entries) == 1:
        ((kind, entry),) = batch.entries.items()
        kinds: Any = kind
        at_most_once: Any = entry.adapter.at_most_once
        instance_level: Any = entry.adapter.instance_level
    else:
        kinds = [request.kind for request in requests]
        flags = {kind: entry.adapter for kind, entry in batch.entries.items()}
        at_most_once = _one_or_each([flags[kind].at_most_once for kind in kinds])
        instance_level = _one_or_each([flags[kind].instance_level for kind in kinds])
    return {
        "kind": kinds,
        "at_most_once": at_most_once,
        "instance_level": instance_level,
        "workspace_id": _one_or_each(_column(requests, "workspace_id")),
        "lane_key": _one_or_each(_column(requests, "lane_key")),
        "idempotency_key": keys,
        "payload": batch.payloads,
        "subject_account_id": _one_or_each(_column(requests, "subject_account_id")),
        "state": _one_or_each([_PROPOSED if r.proposed else _ADMITTED for r in requests]),
        "max_attempts": (
            batch.max_attempts
            if isinstance(batch.max_attempts, int)
            else _one_or_each(batch.max_attempts)
        ),
        "due_at": _times(_column(requests, "not_before")),
        "expires_at": _times(_column(requests, "expires_at")),
        "key_order": ranks,
    }


def _column(requests: Sequence[ActionRequest], name: str) -> list[Any]:
    """One field of every request, in request order."""
    return list(map(attrgetter(name), requests))


def _times(values: list[datetime | None]) -> Any:
    """A column of times as the statement reads it: ISO 8601 text, or NULL for all."""
    if values.count(None) == len(values):
        return None
    return _one_or_each([None if when is None else when.isoformat() for when in values])


def _one_or_each(values: list[Any]) -> Any:
    """The column as one value when every request has the same, else the list."""
    first = values[0]
    return first if values.count(first) == len(values) else values


def batch_answers(
    requests: Sequence[ActionRequest], created: list[int], found: dict[str, int] | None
) -> list[Enqueued]:
    """Each request's answer, in request order, from the ids the statement created (ascending:
    drawn in request order, one per request whose key was new) and, when some key was not new,
    the action each key names (``found``, from ``find_by_keys``). A key repeated in the batch
    is created by its first request; the others answer that action, not created."""
    if found is None and len(created) == len(requests):
        return [Enqueued(action_id, True) for action_id in created]
    answers: list[Enqueued] = []
    append = answers.append
    if found is None:  # every key new, some repeated in the batch
        ids = iter(created)
        first: dict[str, int] = {}
        for request in requests:
            key = request.idempotency_key
            action_id = first.get(key)
            if action_id is None:
                action_id = first[key] = next(ids)
                append(Enqueued(action_id, True))
            else:
                append(Enqueued(action_id, False))
        return answers
    made = set(created)
    handed: set[str] = set()
    for request in requests:
        key = request.idempotency_key
        action_id = found[key]
        append(Enqueued(action_id, action_id in made and key not in handed))
        handed.add(key)
    return answers
