"""Two builds of one plugin, for the rolling-update tests: build 2 knows a variant (or a kind)
that build 1 lacks. Each scenario names what changed between the builds."""

from __future__ import annotations

import enum
import os
from typing import Any

import psycopg
from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
    KindRegistry,
)

SCENARIOS = ("tagged", "kind", "enum", "suffix")
KIND = "ROLL_K"
NEW_KIND = "ROLL_NEW"
RECORD = "CREATE TABLE IF NOT EXISTS public.rolling_record (action_id bigint, build int, write_started boolean, at timestamptz DEFAULT clock_timestamp())"


class Body(BaseModel):
    n: int = 0


class ColorV1(enum.Enum):
    RED = "red"


class ColorV2(enum.Enum):
    RED = "red"
    BLUE = "blue"


class PaintV1(BaseModel):
    color: ColorV1


class PaintV2(BaseModel):
    color: ColorV2


def _variants(build: int, scenario: str) -> ActionVariants:
    match scenario:
        case "tagged":
            bodies = {"a": Body} if build == 1 else {"a": Body, "b": Body}
            return ActionVariants.tagged("v", "body", bodies)
        case "enum":
            return ActionVariants.one(PaintV1 if build == 1 else PaintV2)
        case "suffix":
            return ActionVariants.key_suffix(["send"] if build == 1 else ["send", "edit"], Body)
        case _:
            return ActionVariants.one(Body)


def payload(scenario: str, variant: str) -> dict[str, Any]:
    """The payload of an `a` row (both builds decode it) or a `b` row (only build 2 does)."""
    match scenario:
        case "tagged":
            return {"v": variant, "body": {"n": 1}}
        case "enum":
            return {"color": "red" if variant == "a" else "blue"}
        case _:
            return {"n": 1}


def key(scenario: str, variant: str, name: str) -> str:
    if scenario == "suffix":
        return f"{name}:{'send' if variant == 'a' else 'edit'}"
    return name


def kind_of(scenario: str, variant: str) -> str:
    return NEW_KIND if scenario == "kind" and variant == "b" else KIND


def registry(build: int, scenario: str) -> KindRegistry:
    """The kinds that build `build` registers in `scenario`."""
    url = os.environ.get("ROLLING_URL", "")

    class Recording(ActionAdapter):
        kind = KIND
        instance_level = True

        @classmethod
        def variants(cls) -> ActionVariants:
            return _variants(build, scenario)

        async def execute(self, attempt: ActionAttempt) -> AdapterResult:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            async with conn:
                await conn.execute(
                    "INSERT INTO public.rolling_record (action_id, build, write_started) VALUES (%s, %s, %s)",
                    (attempt.id, build, attempt.write_started),
                )
            return Done(f"build-{build}")

    class NewKind(Recording):
        kind = NEW_KIND

        @classmethod
        def variants(cls) -> ActionVariants:
            return ActionVariants.one(Body)

    found = KindRegistry()
    found.register(Recording, distribution="outbox-rolling", version=f"{build}.0")
    if build == 2 and scenario == "kind":
        found.register(NewKind, distribution="outbox-rolling", version="2.0")
    return found
