"""Fuzzed enqueue: whatever a producer passes (kinds, lane and idempotency keys, payloads, times,
workspaces, subjects, attempts; unicode, NUL characters, lone surrogates, huge values), enqueue
either refuses it with a documented error that names the field and writes nothing, or writes a
row that reads back exactly as it was asked for. ``enqueue_many`` too: a batch with one bad
request writes none of the others."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox_core import ActionRequest, InvalidRequest, UnknownKind
from outbox_core.testing import OutboxTestDatabase

from .kinds import SuffixAdapter

FIELDS = (
    "kind",
    "lane_key",
    "idempotency_key",
    "payload",
    "workspace_id",
    "subject_account_id",
    "max_attempts",
    "expires_at",
    "not_before",
)

# Every code point, lone surrogates and NUL included, with the awkward ones made common.
CHARS = st.one_of(
    st.characters(codec=None, categories=None),
    st.sampled_from(["\x00", "\ud800", "\udfff", "é", "\u202e", "\U0001f600", "'", '"', "\\"]),
)
TEXT = st.one_of(
    st.text(CHARS, max_size=20),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
    # Huge: a repeated value compresses in an index row, a random one does not.
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\U0001f600"]), st.integers(0, 3000)),
    st.binary(min_size=600, max_size=1600).map(bytes.hex),
)
KIND = st.one_of(
    st.sampled_from(["TEST_NOOP", "TEST_ONCE", "TEST_PAINT", "TEST_SUFFIX"]),
    st.sampled_from(["TEST_NOPE", "", "test_noop", "TEST\x00NOOP", 'X"; DROP TABLE x; --']),
)
NUMBER = st.one_of(
    st.integers(),
    st.integers(-(10**40), 10**40),
    st.integers(0, 100).map(lambda e: 10 ** (4000 + e)),  # beyond the 3900 digits enqueue takes
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e16, 1e23, -0.0, 5e-324, 0.1]),
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
PAYLOAD = st.one_of(
    st.fixed_dictionaries(
        {"n": st.one_of(st.integers(-(2**70), 2**70), NUMBER)},
        optional={"note": st.one_of(st.none(), TEXT)},
    ).flatmap(lambda base: st.dictionaries(TEXT, JSON, max_size=3).map(lambda x: {**x, **base})),
    st.fixed_dictionaries({"color": st.sampled_from(["red", "blue", "green"])}),
    st.dictionaries(TEXT, JSON, max_size=3),
)
TIME = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12, minutes=30))]
        ),
    ),
    st.datetimes(timezones=st.none()),
    st.builds(lambda s: datetime.now(UTC) + timedelta(seconds=s), st.integers(-3600, 3600 * 24)),
)
REQUEST = st.builds(
    ActionRequest,
    kind=KIND,
    lane_key=TEXT,
    idempotency_key=st.one_of(TEXT, TEXT.map(lambda key: f"{key}:create")),
    payload=PAYLOAD,
    workspace_id=st.one_of(st.none(), TEXT),
    subject_account_id=st.one_of(st.none(), TEXT),
    max_attempts=st.one_of(st.none(), st.integers(-2, 2**40)),
    expires_at=TIME,
    not_before=TIME,
)

FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def same(left: Any, right: Any) -> bool:
    """Equal, and of the same JSON type all the way down (1 is not 1.0, True is not 1)."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(map(same, left, right))
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        return left == right or (math.isnan(left) and math.isnan(right))
    return bool(left == right)


def assert_clear(refused: InvalidRequest | UnknownKind) -> None:
    """A documented error that names the field, in one line. It may repeat a key (at most
    MAX_TEXT_BYTES) or a kind, never a payload value."""
    message = str(refused)
    assert "\n" not in message and len(message) < 3000, message
    if isinstance(refused, UnknownKind):
        assert "no installed plugin registers it" in message
        return
    assert refused.field.split(".")[0].split("[")[0] in FIELDS, message
    assert message.startswith(f"{refused.field}: "), message


def check(
    conn: psycopg.Connection[Any], db: OutboxTestDatabase, requests: list[ActionRequest]
) -> None:
    """Enqueue ``requests`` (one alone, or as a batch) in a transaction that is rolled back."""
    outbox = db.outbox
    try:
        with conn.transaction(force_rollback=True):
            refused: InvalidRequest | UnknownKind | None = None
            try:
                if len(requests) == 1:
                    answers = [outbox.enqueue(conn, requests[0])]
                else:
                    answers = outbox.enqueue_many(conn, requests)
            except (InvalidRequest, UnknownKind) as exc:
                refused = exc
            if refused is not None:
                assert_clear(refused)
                assert rows(conn, db) == [], "a refused enqueue wrote rows"
                return
            stored = {row[0]: row for row in rows(conn, db)}
            by_key: dict[str, ActionRequest] = {}
            for request in requests:
                by_key.setdefault(request.idempotency_key, request)
            assert len(stored) == len(by_key)
            for answer, request in zip(answers, requests, strict=True):
                row = stored[answer.id]
                first = by_key[request.idempotency_key]
                assert row[1:7] == (
                    first.kind,
                    first.lane_key,
                    first.idempotency_key,
                    first.workspace_id,
                    first.subject_account_id,
                    first.max_attempts if first.max_attempts is not None else 5,
                ), row
                assert same(row[7], dict(first.payload)), (row[7], first.payload)  # type: ignore[arg-type]
                if first.not_before is not None:
                    assert row[8] == first.not_before
                assert row[9] == first.expires_at
    except psycopg.Error as exc:  # pragma: no cover - what this test exists to catch
        pytest.fail(f"enqueue let PostgreSQL refuse it: {type(exc).__name__}: {exc}")


def rows(conn: psycopg.Connection[Any], db: OutboxTestDatabase) -> list[tuple[Any, ...]]:
    query = (
        "SELECT id, kind, lane_key, idempotency_key, workspace_id, subject_account_id, "
        "max_attempts, payload, due_at, expires_at FROM {schema}.agent_action ORDER BY id"
    )
    return conn.execute(query.replace("{schema}", f'"{db.schema}"')).fetchall()


@pytest.fixture
def fuzz_db(db: OutboxTestDatabase) -> OutboxTestDatabase:
    db.register_kind(SuffixAdapter)
    return db


@FUZZ
@given(request=REQUEST)
def test_one_fuzzed_request_is_refused_by_name_or_round_trips(
    fuzz_db: OutboxTestDatabase, request: ActionRequest
) -> None:
    with fuzz_db.connect() as conn:
        check(conn, fuzz_db, [request])


@FUZZ
@given(requests=st.lists(REQUEST, min_size=2, max_size=4))
def test_a_fuzzed_batch_is_refused_whole_or_round_trips(
    fuzz_db: OutboxTestDatabase, requests: list[ActionRequest]
) -> None:
    with fuzz_db.connect() as conn:
        check(conn, fuzz_db, requests)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lane_key": "lane\x00"}, "lane_key"),
        ({"idempotency_key": "key\x00"}, "idempotency_key"),
        ({"workspace_id": "w\x00"}, "workspace_id"),
        ({"subject_account_id": "\ud800"}, "subject_account_id"),
        ({"idempotency_key": "ab" * 1500}, "idempotency_key"),
        ({"payload": {"n": 1, "note": "a\x00b"}}, "payload.note"),
        ({"payload": {"n": 1, "note": "\udc80"}}, "payload.note"),
        ({"payload": {"n": 1, "extra": [float("nan")]}}, "payload.extra[0]"),
        ({"payload": {"n": 1, "extra": 1e23}}, "payload.extra"),
        ({"max_attempts": 2**31}, "max_attempts"),
    ],
)
def test_what_postgresql_would_refuse_is_refused_first_by_name_and_the_batch_writes_nothing(
    fuzz_db: OutboxTestDatabase, change: dict[str, Any], field: str
) -> None:
    """Each of these reached PostgreSQL (or psycopg) before enqueue checked it, and failed there
    with an error that named no field (DataError, UntranslatableCharacter,
    ProgramLimitExceeded, UnicodeEncodeError, NumericValueOutOfRange)."""
    base = {"kind": "TEST_NOOP", "lane_key": "l", "idempotency_key": "k", "payload": {"n": 1}}
    bad = ActionRequest(**{**base, **change})
    good = ActionRequest("TEST_NOOP", "l", "good", payload={"n": 2})
    with fuzz_db.connect() as conn:
        with pytest.raises(InvalidRequest) as refused:
            fuzz_db.outbox.enqueue(conn, bad)
        assert refused.value.field == field
        with pytest.raises(InvalidRequest):
            fuzz_db.outbox.enqueue_many(conn, [good, bad])
        conn.commit()  # the caller's transaction is still usable, and holds nothing
    assert fuzz_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0
    assert fuzz_db.scalar("SELECT count(*) FROM {schema}.action_lane") == 0
