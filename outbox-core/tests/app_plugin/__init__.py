"""An application's own kind, registered in code: the module that ``OUTBOX_APP_PLUGINS`` names
in the tests of that variable (``tests.app_plugin``)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
    MigrationLine,
    hookimpl,
)

KIND = "TEST_APP_KIND"


class Greeting(BaseModel):
    name: str = "world"


class AppAdapter(ActionAdapter):
    kind = KIND
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Greeting)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done(f"greeted-{attempt.id}")


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(AppAdapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("test_app", __name__, "migrations"))
