"""Variants: the declarations, the JSON path derived from them, and decoding reads."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError, create_model

from outbox_core import ActionRequest, ActionVariants, InvalidRequest, UndecodableAction
from outbox_core.testing import OutboxTestDatabase

from .kinds import Paint, SuffixAdapter, SuffixAdapterBuild2


class Shade(enum.Enum):
    LIGHT = "light"
    DARK = "dark"


class Inner(BaseModel):
    shade: Shade


class Outer(BaseModel):
    tone: Literal["warm", "cool"]
    inner: Inner
    extra: Inner | None = None
    shades: list[Shade] = []
    label: str = ""


def test_one_derives_a_path_from_enums_literals_nested_and_optional_fields() -> None:
    path = ActionVariants.one(Outer).json_path()
    assert path == (
        '($."tone" == "warm" || $."tone" == "cool") && ($."inner"."shade" == "light" || '
        '$."inner"."shade" == "dark") && (!(exists($."extra")) || $."extra" == null || '
        '($."extra"."shade" == "light" || $."extra"."shade" == "dark")) && '
        '(!(exists($."shades")) || !(exists($."shades"[*] ? (@ != "light" && @ != "dark"))))'
    )


def test_tagged_derives_one_alternative_per_tag() -> None:
    variants = ActionVariants.tagged("notice", "event", {"welcome": Inner, "bye": Paint})
    path = variants.json_path()
    assert path is not None
    assert path.startswith('($."notice" == "bye" && ($."event"."color" == "red"')
    assert '($."notice" == "welcome" && ($."event"."shade" == "light"' in path


def test_a_tag_naming_no_registered_variant_names_the_registered_ones_the_nearest_and_the_cause() -> (
    None
):
    variants = ActionVariants.tagged("notice", "event", {"welcome": Inner, "bye": Paint})
    with pytest.raises(InvalidRequest) as refused:
        variants.decode({"notice": "welcom", "event": {}}, "k", kind="EMAIL")
    assert refused.value.field == "payload.notice"
    assert str(refused.value).startswith(
        "payload.notice: no notice 'welcom' is registered for EMAIL (did you mean "
        "'welcome'?); registered ones are bye, welcome; is OUTBOX_APP_PLUGINS set in this "
        "process?"
    )
    with pytest.raises(InvalidRequest, match="the payload names no notice"):
        variants.decode({"event": {}}, "k", kind="EMAIL")


def test_a_tag_value_not_shaped_like_a_name_in_code_is_not_repeated_in_the_error() -> None:
    """A payload value that may be data is never in an error (tests/security), the tag's
    included; only a value shaped like a name in code (``email_changed``) is named."""
    variants = ActionVariants.tagged("notice", "event", {"welcome": Inner})
    with pytest.raises(InvalidRequest) as refused:
        variants.decode({"notice": "ada@example.com", "event": {}}, "k", kind="EMAIL")
    assert "ada@example.com" not in str(refused.value)
    for data in ("Ada Lovelace", "cAnArY-5d1e", "x" * 65, "welcome\n"):
        with pytest.raises(InvalidRequest) as refused:
            variants.decode({"notice": data, "event": {}}, "k", kind="EMAIL")
        assert data not in str(refused.value)
        assert str(refused.value).startswith("payload.notice: no notice is registered for EMAIL")


def test_a_placeholder_variant_is_never_offered_as_registered() -> None:
    variants = ActionVariants.tagged("notice", "event", {"none:yet": Inner}, placeholder="none:yet")
    with pytest.raises(InvalidRequest) as refused:
        variants.decode({"notice": "welcome", "event": {}}, "k", kind="EMAIL")
    assert "registered ones are none;" in str(refused.value)
    assert "none:yet" not in str(refused.value)
    with pytest.raises(ValueError, match="the placeholder is one of the declared tag values"):
        ActionVariants.tagged("notice", "event", {"a": Inner}, placeholder="b")


def test_key_suffix_derives_a_pattern_for_the_last_segment() -> None:
    variants = ActionVariants.key_suffix(["send", "edit.v2"], Inner)
    assert variants.key_pattern() == r"(^|:)(edit\.v2|send)$"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ActionVariants.tagged("t", "t", {"a": Inner}), "two different properties"),
        (lambda: ActionVariants.tagged("t", "b", {}), "at least one tag value"),
        (lambda: ActionVariants.key_suffix(["a:b"], Inner), "is not one key segment"),
        (lambda: ActionVariants.one(dict), "expected a pydantic model class"),  # type: ignore[arg-type]
    ],
)
def test_malformed_declarations_are_refused(make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def sql_accepts(
    conn: psycopg.Connection, variants: ActionVariants, payload: Any, key: str = "k"
) -> bool:
    row = conn.execute(
        "SELECT outbox.decodable_v1('K', %s::jsonb, %s, ARRAY['K'], ARRAY[%s::jsonpath], ARRAY[%s])",
        (psycopg.types.json.Jsonb(payload), key, variants.json_path(), variants.key_pattern()),
    ).fetchone()
    assert row is not None
    return bool(row[0])


# -- the law: the SQL path accepts a payload exactly when the model accepts it --------------

VALUES = ["a", "b", "c", "d"]
field_type = st.deferred(
    lambda: st.one_of(
        st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True).map(
            lambda vs: ("literal", vs)
        ),
        st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True).map(
            lambda vs: ("enum", vs)
        ),
        st.tuples(st.just("optional"), field_type),
        st.tuples(
            st.just("list"), st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True)
        ),
        st.tuples(
            st.just("model"),
            st.dictionaries(st.sampled_from(["x", "y"]), field_type, min_size=1, max_size=2),
        ),
    )
)
schemas = st.dictionaries(st.sampled_from(["p", "q", "r"]), field_type, min_size=1, max_size=3)


def build(schema: dict[str, Any], name: str = "M") -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for field, spec in schema.items():
        annotation, default = annotate(spec, f"{name}_{field}")
        fields[field] = (annotation, default)
    return create_model(name, **fields)


def annotate(spec: Any, name: str) -> tuple[Any, Any]:
    kind = spec[0]
    if kind == "literal":
        return Literal[tuple(spec[1])], ...  # type: ignore[valid-type]
    if kind == "enum":
        return enum.Enum(name, {v.upper(): v for v in spec[1]}), ...
    if kind == "optional":
        inner, _ = annotate(spec[1], name)
        return Optional[inner], None  # noqa: UP045
    if kind == "list":
        return list[enum.Enum(name, {v.upper(): v for v in spec[1]})], []  # type: ignore[misc]
    return build(spec[1], name), ...


def payload_for(spec: Any) -> st.SearchStrategy[Any]:
    kind = spec[0]
    if kind in ("literal", "enum"):
        return st.sampled_from(VALUES)
    if kind == "optional":
        return st.one_of(st.none(), payload_for(spec[1]))
    if kind == "list":
        return st.lists(st.sampled_from(VALUES), max_size=3)
    return payloads_for(spec[1])


def payloads_for(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Structurally complete payloads (required fields present) whose discriminating values
    vary: in or out of the declared set, and absent or null where the field allows it."""
    required = {
        f: payload_for(spec)
        for f, spec in schema.items()
        if spec[0] in ("literal", "enum", "model")
    }
    optional = {f: payload_for(spec) for f, spec in schema.items() if f not in required}
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = draw(schemas)
    return schema, draw(payloads_for(schema))


@pytest.fixture(scope="module")
def plain_conn(outbox_server: str, outbox_template: str):  # type: ignore[no-untyped-def]
    from outbox_core.testing.database import fresh_database

    with (
        fresh_database(outbox_server, outbox_template) as (url, _),
        psycopg.connect(url, autocommit=True) as conn,
    ):
        yield conn


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases())
def test_the_sql_path_accepts_a_payload_exactly_when_the_model_does(
    plain_conn: psycopg.Connection, case: Any
) -> None:
    schema, payload = case
    model = build(schema)
    try:
        model.model_validate(payload)
        accepted = True
    except ValidationError:
        accepted = False
    assert sql_accepts(plain_conn, ActionVariants.one(model), payload) is accepted, (
        schema,
        payload,
    )


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tag=st.sampled_from(["welcome", "bye", "later", ""]),
    shade=st.sampled_from(["light", "dark", "dim"]),
)
def test_a_tagged_payload_matches_exactly_when_its_tag_and_body_are_known(
    plain_conn: psycopg.Connection, tag: str, shade: str
) -> None:
    variants = ActionVariants.tagged("notice", "event", {"welcome": Inner, "bye": Inner})
    payload = {"notice": tag, "event": {"shade": shade}}
    expected = tag in ("welcome", "bye") and shade in ("light", "dark")
    assert sql_accepts(plain_conn, variants, payload) is expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [("draft:1:send", True), ("send", True), ("draft:1:edit", False), ("draft:1:resend", False)],
)
def test_a_key_suffix_matches_only_declared_last_segments(
    plain_conn: psycopg.Connection, key: str, expected: bool
) -> None:
    assert (
        sql_accepts(plain_conn, ActionVariants.key_suffix(["send"], Inner), {"shade": "dark"}, key)
        is expected
    )


# Three kinds served at once: A checks nothing, B a path, C a path and a key suffix. Each row
# must be judged by its own kind's entry, whatever the entry's position in the arrays.
SERVED = (
    ["A", "B", "C"],
    [None, '$.mode == "fast"', '$.mode == "slow"'],
    [None, None, "(^|:)(send)$"],
)


@pytest.mark.parametrize(
    ("kind", "payload", "key", "expected"),
    [
        ("A", {"mode": "anything"}, "x:edit", True),
        ("B", {"mode": "fast"}, "x:edit", True),
        ("B", {"mode": "slow"}, "x:send", False),
        ("C", {"mode": "slow"}, "x:send", True),
        ("C", {"mode": "slow"}, "x:edit", False),
        ("C", {"mode": "fast"}, "x:send", False),
        ("D", {"mode": "fast"}, "x:send", False),
        ("B", None, "x:send", False),
    ],
)
@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_each_row_is_judged_by_its_own_kinds_entry(
    plain_conn: psycopg.Connection,
    kind: str,
    payload: Any,
    key: str,
    expected: bool,
    order: list[int],
) -> None:
    kinds, paths, suffixes = ([column[i] for i in order] for column in SERVED)
    row = plain_conn.execute(
        "SELECT outbox.decodable_v1(%s, %s::jsonb, %s, %s::text[], %s::jsonpath[], %s::text[])",
        (
            kind,
            None if payload is None else psycopg.types.json.Jsonb(payload),
            key,
            kinds,
            paths,
            suffixes,
        ),
    ).fetchone()
    assert row is not None
    assert row[0] is expected


def test_the_claim_filter_has_one_entry_per_kind(db: OutboxTestDatabase) -> None:
    # decodable_v1 reads the first entry of a kind; a kind named twice must not be sent twice.
    chosen = db.outbox.registry.filter(["TEST_NOOP", "TEST_SCRIPTED", "TEST_NOOP"])
    assert chosen.kinds == ["TEST_NOOP", "TEST_SCRIPTED"]
    assert len(chosen.paths) == len(chosen.suffixes) == 2


def test_the_claims_filter_is_inlined_not_called_per_row(plain_conn: psycopg.Connection) -> None:
    # A SQL function the planner cannot inline runs as its own executor call for every row the
    # claim looks at; written as one expression, it disappears into the plan.
    plan = "\n".join(
        row[0]
        for row in plain_conn.execute(
            "EXPLAIN VERBOSE SELECT outbox.decodable_v1(a.kind, a.payload, a.idempotency_key, "
            "ARRAY['A'], ARRAY[NULL]::jsonpath[], ARRAY[NULL]::text[]) FROM outbox.agent_action a"
        )
    )
    assert "decodable_v1" not in plan
    assert "array_position" in plan


def test_a_decoding_lane_read_raises_on_a_variant_this_build_lacks(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(
            conn,
            ActionRequest(
                "TEST_PAINT", "wall", "paint-1", payload={"color": "red"}, workspace_id="w"
            ),
        )
        conn.commit()
    db.execute(
        'UPDATE {schema}.agent_action SET payload = \'{"color": "green"}\''
    )  # a newer build's color
    with db.connect() as conn:
        assert [a.payload for a in db.outbox.lane(conn, "wall", decode=False)] == [
            {"color": "green"}
        ]
        with pytest.raises(UndecodableAction, match="this build cannot decode a TEST_PAINT action"):
            db.outbox.lane(conn, "wall")
        with pytest.raises(UndecodableAction):
            db.outbox.by_keys(conn, ["paint-1"])


def test_a_decoding_read_raises_on_a_kind_this_build_lacks(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "noop-1"))
        conn.commit()
    db.registry.unregister("TEST_NOOP")
    with (
        db.connect() as conn,
        pytest.raises(UndecodableAction, match="a kind this build does not have"),
    ):
        db.outbox.lane(conn, "lane")


def _nested(depth: int) -> type[BaseModel]:
    model: type[BaseModel] = create_model("Leaf", tone=(Literal["warm"], ...))
    for level in range(depth):
        model = create_model(f"Level{level}", inner=(model, ...))
    return model


def _nested_payload(depth: int, tone: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"tone": tone}
    for _ in range(depth):
        payload = {"inner": payload}
    return payload


def test_the_path_checks_a_value_at_any_depth_of_nesting(plain_conn: psycopg.Connection) -> None:
    variants = ActionVariants.one(_nested(12))
    assert sql_accepts(plain_conn, variants, _nested_payload(12, "warm"))
    assert not sql_accepts(plain_conn, variants, _nested_payload(12, "cold"))


class Node(BaseModel):
    tone: Literal["warm", "cool"]
    child: Node | None = None


def test_a_model_that_contains_itself_is_checked_above_its_first_repetition(
    plain_conn: psycopg.Connection,
) -> None:
    variants = ActionVariants.one(Node)
    assert variants.json_path() == '($."tone" == "warm" || $."tone" == "cool")'
    assert not sql_accepts(plain_conn, variants, {"tone": "hot"})
    # From the repetition down, decoding at the attempt refuses what the path let through
    # (the executor defers such a row instead of failing it).
    nested = {"tone": "warm", "child": {"tone": "hot"}}
    assert sql_accepts(plain_conn, variants, nested)
    with pytest.raises(InvalidRequest):
        variants.decode(nested, "k", kind="K")


def test_a_decoding_read_refuses_an_ended_row_of_a_key_suffix_variant_this_build_lacks(
    db: OutboxTestDatabase,
) -> None:
    # Build 2 knows "create" and "edit"; it enqueues both, and the "edit" action ends.
    db.register_kind(SuffixAdapterBuild2)
    with db.connect() as conn:
        for key in ("doc:create", "doc:edit"):
            db.outbox.enqueue(conn, ActionRequest("TEST_SUFFIX", "doc", key))
        db.outbox.enqueue(conn, ActionRequest("TEST_SUFFIX", "other", "live:edit"))
        conn.commit()
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'CANCELLED', payload = NULL, "
        "stop_reason = 'OPERATOR_CANCELLED', ended_at = now() WHERE idempotency_key = 'doc:edit'"
    )
    with db.connect() as conn:
        assert len(db.outbox.lane(conn, "doc", live_only=False)) == 2
    # Build 1 knows "create" only. The ended row has no payload, but its key still names the
    # variant: a decoding read refuses it, as it refuses the live one.
    db.registry.unregister("TEST_SUFFIX")
    db.registry.register(SuffixAdapter)
    with db.connect() as conn:
        with pytest.raises(UndecodableAction, match="'edit' is not one of \\['create'\\]"):
            db.outbox.lane(conn, "doc", live_only=False)
        with pytest.raises(UndecodableAction, match="cannot decode a TEST_SUFFIX action"):
            db.outbox.by_keys(conn, ["doc:edit"])
        with pytest.raises(UndecodableAction, match="cannot decode a TEST_SUFFIX action"):
            db.outbox.by_keys(conn, ["live:edit"])
        # What it does know still reads, and a non-decoding read returns everything.
        assert [a.idempotency_key for a in db.outbox.lane(conn, "doc")] == ["doc:create"]
        assert [a.idempotency_key for a in db.outbox.by_keys(conn, ["doc:create"])] == [
            "doc:create"
        ]
        assert [
            a.idempotency_key for a in db.outbox.lane(conn, "doc", live_only=False, decode=False)
        ] == ["doc:create", "doc:edit"]
