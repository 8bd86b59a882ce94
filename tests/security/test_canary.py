"""A canary string in every payload field of every kind of every installed package (and of the
core's test kinds) is never in a log record, a metric label, a span attribute, the output of a
command other than ``outbox show --payload``, or an exception message: across a full run
through the providers well, refusing (4xx), failing (5xx) and dropping after the write.

The payloads come from each kind's registered variants (:mod:`.payloads`): a new kind, variant
or field is filled with the canary without a change here. Lane and idempotency keys are not
payload: a kind may build them from its payload's identifiers (the issue kinds' lane names the
report), so each action's own keys are blanked out of what is searched."""

from __future__ import annotations

import dataclasses
import enum
import logging
import traceback
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from outbox_core import ActionRequest, ActionVariants, OutboxError
from outbox_core.cli import main

from .conftest import telemetry
from .payloads import Variant, string_values, variants_of
from .world import CANARY, PHASES, World, held

Leak = tuple[str, str]
PROVIDER_LOGGERS = ("mail.log",)
"""The loopback providers' own loggers (aiosmtpd logs the message it receives): the provider's
side, which holds the effect, not outbox's."""


def leaks(found: Iterable[tuple[str, Any]], blank: Iterable[str]) -> list[Leak]:
    """The (where, text) whose text holds the canary once ``blank`` (the actions' own lane and
    idempotency keys) are blanked out."""
    blanks = sorted(set(blank), key=len, reverse=True)
    out = []
    for where, value in found:
        text = str(value)
        for item in blanks:
            text = text.replace(item, "<key>")
        if CANARY.lower() in text.lower():
            out.append((where, text[:500]))
    return out


def record_texts(records: Iterable[logging.LogRecord]) -> list[tuple[str, Any]]:
    """Everything a handler could write of each record: the message, every attribute (the
    events' fields), the exception and its traceback."""
    found: list[tuple[str, Any]] = []
    for record in records:
        if record.name.startswith(PROVIDER_LOGGERS):
            continue
        where = f"log {record.name} {record.levelname}"
        found.append((where, record.getMessage()))
        found.extend((f"{where} {key}", value) for key, value in vars(record).items())
        if record.exc_info and record.exc_info[1] is not None:
            found.append(
                (f"{where} exception", "".join(traceback.format_exception(*record.exc_info)))
            )
    return found


def cli(world: World, *args: str) -> str:
    result = CliRunner().invoke(
        main, list(args), env={"OUTBOX_DATABASE_URL": world.db.url}, catch_exceptions=True
    )
    text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(result.exception))
    return text


def staged(world: World, phase: str, pairs: list[tuple[str, Variant]]) -> list[ActionRequest]:
    """One request per variant of every kind, each free string of its payload holding the
    canary (checked: a stager that drops a field fails here)."""
    out = []
    for n, (kind, variant) in enumerate(pairs):
        request = world.request(kind, variant, f"security-{phase}-{n}")
        values = string_values(held(request), variant.strings)
        assert all(CANARY in str(v) for v in values), (kind, variant.name, values)
        out.append(dataclasses.replace(request, max_attempts=2))
    return out


def refusals(world: World, pairs: list[tuple[str, Variant]]) -> list[tuple[str, Any]]:
    """The messages of the errors that enqueue raises for payloads that do not fit, with the
    canary where a closed set (a tag, an enum, a Literal) or another type was expected, in an
    unknown property, and as the payload itself."""
    found: list[tuple[str, Any]] = []

    def attempt(kind: str, payload: Any, what: str) -> None:
        request = ActionRequest(kind, "security:refused", f"refused-{len(found)}", payload=payload)
        request = dataclasses.replace(request, workspace_id="ws-security")
        with world.db.connect() as conn:
            try:
                world.db.outbox.enqueue(conn, request)
            except OutboxError as exc:
                found.append((f"{kind} {what}: {type(exc).__name__}", str(exc)))
            conn.rollback()

    for kind, variant in pairs:
        attempt(kind, [CANARY], "a list for the payload")
        attempt(kind, {**variant.payload, "extra_property": CANARY}, "an unknown property")
        for path in closed_fields(variant.payload, variant.strings):
            attempt(kind, replaced(variant.payload, path, CANARY), f"the canary at {path}")
        for path in (path for path in variant.strings if "[" not in path):
            attempt(kind, replaced(variant.payload, path, {"v": CANARY}), f"an object at {path}")
    return found


def closed_fields(payload: Any, strings: tuple[str, ...], path: str = "") -> list[str]:
    """The dotted paths of the payload's values that are not free strings (tags, enums, numbers,
    booleans): the canary there is a value the kind must refuse without repeating it."""
    if isinstance(payload, dict):
        return [
            found
            for key, value in payload.items()
            for found in closed_fields(value, strings, f"{path}.{key}".lstrip("."))
        ]
    if isinstance(payload, list) or path in strings:
        return []
    return [path]


def replaced(payload: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    parts = path.split(".")
    if len(parts) == 1:
        return {**payload, parts[0]: value}
    return {**payload, parts[0]: replaced(payload[parts[0]], ".".join(parts[1:]), value)}


def test_the_canary_in_every_payload_field_never_leaves_the_payload(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    db = world.db
    pairs = world.variants()
    kinds = {kind for kind, _ in pairs}
    assert kinds == set(db.registry.kinds), "every registered kind has a variant to fill"
    assert {"EMAIL", "SLACK_POST", "FILE_ISSUE", "TEST_NOOP"} <= kinds

    # The run: every variant of every kind, once per phase, the providers failing as told.
    ids: list[int] = []
    for phase in PHASES:
        requests = staged(world, phase, pairs)
        world.fault(phase)
        ids += world.enqueue(requests)
        db.drain()
        world.clear()
    # And one of each waiting (not due yet), one cancelled by the command line.
    later = datetime.now(UTC) + timedelta(hours=1)
    waiting = [dataclasses.replace(r, not_before=later) for r in staged(world, "later", pairs)]
    waiting_ids = world.enqueue(waiting)
    ids += waiting_ids

    states = db.rows(
        "SELECT state, count(*) FROM {schema}.agent_action WHERE id = ANY(%s) GROUP BY 1",
        (ids,),
    )
    assert {state for state, _ in states} >= {"DONE", "FAILED", "UNCERTAIN", "ADMITTED"}, states
    keys = [
        text
        for row in db.rows(
            "SELECT lane_key, idempotency_key FROM {schema}.agent_action WHERE id = ANY(%s)",
            (ids,),
        )
        for text in row
    ]

    # What the commands print.
    printed: list[tuple[str, Any]] = []
    for args in (["status"], ["status", "--json"], ["plugins"], ["migrate"]):
        printed.append((f"outbox {' '.join(args)}", cli(world, *args)))
    for action_id in ids:
        printed.append((f"outbox show {action_id}", cli(world, "show", str(action_id))))
    printed.append(("outbox cancel", cli(world, "cancel", str(waiting_ids[0]))))
    shown = cli(world, "show", "--payload", str(waiting_ids[-1]))
    assert CANARY in shown, "the control: show --payload prints the payload"

    found = [
        *record_texts(caplog.records),
        *telemetry(),
        *printed,
        *refusals(world, pairs),
    ]
    assert caplog.records, "the run's log records were captured"
    found_leaks = leaks(found, keys)
    assert found_leaks == [], "\n".join(f"{where}: {text}" for where, text in found_leaks)


def test_a_new_kind_is_filled_from_its_variants_without_a_change_here() -> None:
    """The derivation reaches every field of every variant: nested models, lists, optional and
    aliased fields, mappings; closed sets get one of their values, free strings the canary."""

    class Colour(enum.Enum):
        RED = "red"

    class Inner(BaseModel):
        name: str
        colour: Colour

    class Body(BaseModel):
        who: str
        inner: Inner
        many: list[Inner] = []
        maybe: str | None = None
        aliased: str = Field(default="x", alias="Aliased")
        table: dict[str, str] = {}
        mode: Literal["a", "b"] = "a"
        count: int = 0

    declarations = [
        ActionVariants.one(Body),
        ActionVariants.tagged("t", "b", {"one": Body, "two": Inner}),
        ActionVariants.key_suffix(["create", "edit"], Body),
    ]
    found = [variant for d in declarations for variant in variants_of(d, CANARY)]
    assert [v.name for v in found] == ["one", "one", "two", "create", "edit"]
    body = found[0]
    assert set(body.strings) == {
        "who",
        "inner.name",
        "many[0].name",
        "maybe",
        "Aliased",
        "table.k",
    }
    assert all(CANARY in value for value in string_values(body.payload, body.strings))
    Body.model_validate(body.payload)
    assert found[1].payload["t"] == "one" and "b.who" in found[1].strings
    assert found[3].key_suffix == "create"
