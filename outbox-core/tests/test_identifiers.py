"""Names that reach SQL are checked or quoted: the schema name (formatted into every statement),
kind names, migration line names, and the names a plugin's variants put into the claim's JSON
paths and key patterns (tags, enum and Literal values, property names, key suffixes). Hostile
values are refused with a one-line error before any statement runs, or carried as data."""

from __future__ import annotations

import enum
import re
from typing import Any, ClassVar, Literal

import psycopg
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    ConfigurationError,
    Done,
    KindRegistry,
    MigrationError,
    MigrationLine,
    Outbox,
    OutboxSettings,
    RegistrationError,
    UnknownKind,
    migrate,
)
from outbox_core.cli import main
from outbox_core.sqlfiles import quote_schema
from outbox_core.testing import OutboxTestDatabase

from .kinds import NoopAdapter

HOSTILE = [
    'x"; DROP TABLE outbox.agent_action; --',
    "x; DROP SCHEMA outbox CASCADE",
    "Outbox",
    "ünïcode",
    "",
    "1outbox",
    "a b",
    "x\x00",
    "\ud800",
]
LONGEST_SCHEMA = "s" * 56
TOO_LONG_SCHEMAS = ["s" * 57, "s" * 63, "s" * 64, "s" * 1000]


def tables(db: OutboxTestDatabase) -> list[str]:
    return [
        row[0]
        for row in db.rows(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
        )
    ]


@pytest.mark.parametrize("schema", HOSTILE + TOO_LONG_SCHEMAS)
def test_a_hostile_or_too_long_schema_name_is_refused_before_any_statement(
    db: OutboxTestDatabase, schema: str
) -> None:
    before = tables(db)
    with pytest.raises(ValueError, match="lower-case name"):
        quote_schema(schema)
    with pytest.raises(ValueError, match="lower-case name"):
        Outbox(schema=schema)
    # A settings error is one ConfigurationError line naming the setting (settings.py).
    with pytest.raises(ConfigurationError, match="OUTBOX_SCHEMA: .*lower-case name"):
        OutboxSettings(schema_name=schema)
    with psycopg.connect(db.url, autocommit=True) as conn, pytest.raises(ValueError):
        migrate(conn, schema, [])
    if "\x00" not in schema and "\ud800" not in schema:  # not passable as an argument
        for command in (["status"], ["migrate"], ["show", "1"]):
            result = CliRunner().invoke(
                main,
                ["--schema", schema, *command],
                env={"OUTBOX_DATABASE_URL": db.url},
                catch_exceptions=False,
            )
            assert result.exit_code == 2, result.output
            assert result.output.count("\n") == 1, result.output
            assert "schema" in result.output and "lower-case name" in result.output
    assert tables(db) == before


def test_the_longest_schema_name_allowed_migrates_enqueues_wakes_and_runs(
    db: OutboxTestDatabase,
) -> None:
    """Its wake-up channel (``outbox_<schema>``) must fit PostgreSQL's 63-byte names: at 57
    characters every enqueue failed in pg_notify ("channel name too long")."""
    with psycopg.connect(db.url, autocommit=True) as conn:
        migrate(conn, LONGEST_SCHEMA, [])
    outbox = Outbox(schema=LONGEST_SCHEMA, registry=KindRegistry(), host=db.host)
    outbox.registry.register(NoopAdapter)
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(
            outbox.queries["register_kind"],
            {"kind": NoopAdapter.kind, "at_most_once": False, "instance_level": True, "line": "t"},
        )
    with psycopg.connect(db.url) as conn:
        outbox.enqueue(conn, ActionRequest(NoopAdapter.kind, "lane", "long-schema"))
        conn.commit()
    from outbox_core.testing import drain

    assert drain(outbox, db.url) == 1
    state = db.scalar(f'SELECT state FROM "{LONGEST_SCHEMA}".agent_action')
    assert state == "DONE"


@pytest.mark.parametrize(
    "kind",
    ['X"; DROP TABLE agent_action; --', "ÉMAIL", "A" * 64, "", "lower", "A\x00", "A B", "A-B"],
)
def test_a_hostile_kind_name_is_refused_at_registration_by_the_database_and_at_enqueue(
    db: OutboxTestDatabase, kind: str
) -> None:
    hostile = type("HostileAdapter", (NoopAdapter,), {"kind": kind})
    with pytest.raises(RegistrationError, match="upper-case name"):
        KindRegistry().register(hostile)
    if "\x00" not in kind and not re.match(r"^[A-Z][A-Z0-9_]*$", kind):
        # The kind table refuses it too, had a plugin's migration inserted it directly (a long
        # name is only data there: it is never formatted into a statement).
        with pytest.raises(psycopg.errors.CheckViolation):
            db.execute(
                db.outbox.queries["register_kind"].replace(f'"{db.schema}"', "{schema}"),
                {"kind": kind, "at_most_once": False, "instance_level": True, "line": "t"},
            )
    with db.connect() as conn:
        with pytest.raises(UnknownKind):
            db.outbox.enqueue(conn, ActionRequest(kind, "lane", "key"))
        conn.commit()
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


@pytest.mark.parametrize("line", ['x"; DROP', "Email", "ünï", "", "a" * 32, "a\x00"])
def test_a_hostile_migration_line_name_is_refused(line: str) -> None:
    with pytest.raises(MigrationError, match="lower-case name"):
        MigrationLine(line, "outbox_core")


# -- names in the claim's JSON paths and key patterns -------------------------------------------

NASTY = 'it\'s "quoted" \\ $.x == 1 || true) ünï \U0001f600'


class Nasty(enum.Enum):
    ONE = NASTY
    TWO = "plain"


class NastyBody(BaseModel):
    choice: Nasty
    flavour: Literal['a"b', "c'd", "e\\f"] = 'a"b'
    renamed: Literal["$"] | None = Field(default=None, alias='we"ird $.name')


class NastyAdapter(ActionAdapter):
    """A kind whose tag, enum, Literal and property names are hostile to a JSON path."""

    kind = "TEST_NASTY"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.tagged("t", "b", {NASTY: NastyBody, "ok": NastyBody})

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class SuffixesAdapter(NastyAdapter):
    kind = "TEST_NASTY_SUFFIX"
    suffixes: ClassVar[tuple[str, ...]] = ("a.b", "(x|y)", "z+", "[^q]", "ünï")

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.key_suffix(cls.suffixes, NastyBody)


def matches(db: OutboxTestDatabase, kind: str, payload: dict[str, Any], key: str) -> bool:
    """Whether the claim's filter (``decodable_v1``, as the claim calls it) takes the row."""
    found = db.outbox.registry.filter([kind])
    return bool(
        db.scalar(
            "SELECT {schema}.decodable_v1(%s, %s::jsonb, %s, %s, %s::jsonpath[], %s)",
            (
                kind,
                psycopg.types.json.Jsonb(payload),
                key,
                found.kinds,
                found.paths,
                found.suffixes,
            ),
        )
    )


def test_hostile_names_in_variants_are_carried_as_data_in_the_claims_filter(
    db: OutboxTestDatabase,
) -> None:
    db.register_kind(NastyAdapter)
    db.register_kind(SuffixesAdapter)
    body = {"choice": NASTY, "flavour": "c'd", 'we"ird $.name': "$"}
    assert matches(db, "TEST_NASTY", {"t": NASTY, "b": body}, "k1")
    assert not matches(db, "TEST_NASTY", {"t": NASTY, "b": {**body, "choice": "other"}}, "k2")
    assert not matches(db, "TEST_NASTY", {"t": NASTY, "b": {**body, "flavour": "a"}}, "k3")
    assert not matches(db, "TEST_NASTY", {"t": "it's", "b": body}, "k4")
    for suffix in SuffixesAdapter.suffixes:
        assert matches(db, "TEST_NASTY_SUFFIX", body, f"k:{suffix}"), suffix
    for other in ("aXb", "x", "zz", "r", "(x|y)z", "ünï2"):
        assert not matches(db, "TEST_NASTY_SUFFIX", body, f"k:{other}"), other
    with db.connect() as conn:
        db.outbox.enqueue(
            conn, ActionRequest("TEST_NASTY", "l", "k", payload={"t": NASTY, "b": body})
        )
        db.outbox.enqueue(conn, ActionRequest("TEST_NASTY_SUFFIX", "l", "k:(x|y)", payload=body))
        conn.commit()
    assert db.drain() == 2
    assert db.rows("SELECT DISTINCT state FROM {schema}.agent_action") == [("DONE",)]


@pytest.mark.parametrize("bad", ["nul\x00", "\udc80"])
def test_a_name_that_no_json_path_can_hold_is_refused_at_registration(bad: str) -> None:
    """A NUL character or a lone surrogate in an enum value, a Literal, a property name, a tag
    or a key suffix cannot go into PostgreSQL's jsonpath or text: every claim of every kind
    would fail. The registry refuses the kind, naming its adapter."""
    declarations = [ActionVariants.tagged("t", "b", {bad: NastyBody})]
    if bad == "nul\x00":  # pydantic builds no model that holds a lone surrogate
        bad_enum = enum.Enum("BadEnum", {"X": bad})  # type: ignore[misc]
        models = [
            type("ByEnum", (BaseModel,), {"__annotations__": {"v": bad_enum}}),
            type("ByLiteral", (BaseModel,), {"__annotations__": {"v": Literal[bad]}}),  # type: ignore[valid-type]
            type(
                "ByAlias",
                (BaseModel,),
                {"__annotations__": {"v": Literal["x"]}, "v": Field(alias=f"v{bad}")},
            ),
        ]
        declarations.extend(ActionVariants.one(model) for model in models)
    for declaration in declarations:
        adapter = type(
            "BadNames",
            (NoopAdapter,),
            {"kind": "TEST_BAD_NAMES", "variants": classmethod(lambda cls, d=declaration: d)},
        )
        with pytest.raises(RegistrationError, match="BadNames.variants"):
            KindRegistry().register(adapter)
    with pytest.raises(ValueError, match="key_suffix"):
        ActionVariants.key_suffix([bad], NastyBody)
