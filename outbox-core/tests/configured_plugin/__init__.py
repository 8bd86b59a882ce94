"""An application's kind with a settings section of its own (``OUTBOX_CONFIGURED_*``,
``[outbox.configured]``), as an effect package's is: the stand-in for outbox-email's settings in
the core's tests (only the core is installed in the core's test session). Named in
``OUTBOX_APP_PLUGINS`` as ``tests.configured_plugin``."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import SettingsConfigDict

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    ConfiguredAdapter,
    Done,
    SectionSettings,
    hookimpl,
)

KIND = "TEST_CONFIGURED_KIND"


class ConfiguredSettings(SectionSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_CONFIGURED_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.configured"

    tls: Literal["implicit", "starttls", "none"] = "starttls"
    sender: str | None = None
    port: int = Field(default=25, ge=1, le=65535)
    labels: list[str] = Field(default_factory=list)

    @field_validator("sender")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        if value is not None and "@" not in value:
            raise ValueError("not an address of the form local@domain.tld")
        return value


class Note(BaseModel):
    text: str = ""


class ConfiguredKindAdapter(ConfiguredAdapter[ConfiguredSettings]):
    kind = KIND

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Note)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done(f"noted-{attempt.id}")


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(ConfiguredKindAdapter)
