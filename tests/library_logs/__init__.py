"""An application's kind that calls an HTTP server with httpx, as the effect packages do: the
module that ``OUTBOX_APP_PLUGINS`` names in tests/test_run_library_logs.py."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
    MigrationLine,
    Retry,
    hookimpl,
)

KIND = "TEST_HTTP_GET"


class Fetch(BaseModel):
    url: str


class FetchAdapter(ActionAdapter):
    kind = KIND
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Fetch)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        async with httpx.AsyncClient() as client:
            answer = await client.get(attempt.body.url)
        return Done(str(answer.status_code)) if answer.is_success else Retry()


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(FetchAdapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("test_library_logs", __name__, "migrations"))
