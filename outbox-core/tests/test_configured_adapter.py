"""What the effect packages' adapters share, in one home: ``ConfiguredAdapter`` (a settings
section bound or loaded, the provider timeout held below the fence margin), ``PerLoop`` (a
client per event loop) and ``retry_after`` (the wait a provider's answer asks for)."""

from __future__ import annotations

import asyncio
import email.utils
import time
from datetime import timedelta
from typing import ClassVar

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from outbox_core import (
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    ConfigurationError,
    ConfiguredAdapter,
    Done,
    OutboxSettings,
    PerLoop,
    SectionSettings,
    retry_after,
)


class ProbeSettings(SectionSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_PROBE_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.probe"

    connect_timeout_seconds: float = Field(default=5.0, gt=0)
    request_timeout_seconds: float = Field(default=20.0, gt=0)
    channel: str = "general"


class OtherSettings(SectionSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_OTHER_", extra="ignore")


class ProbeAdapter(ConfiguredAdapter[ProbeSettings]):
    """The probe's own docstring."""

    kind = "PROBE"
    provider_timeout_settings = ("connect_timeout_seconds", "request_timeout_seconds")
    notices: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def variants(cls) -> ActionVariants:
        raise NotImplementedError

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


def test_the_settings_section_is_the_type_argument() -> None:
    assert ProbeAdapter.settings_class is ProbeSettings


def test_a_bound_class_keeps_its_name_and_builds_with_the_bound_settings() -> None:
    settings = ProbeSettings(channel="bound")

    bound = ProbeAdapter.bind(settings=settings, notices=("welcome",))
    adapter = bound.build(OutboxSettings(schema_name="custom"))

    assert (bound.__name__, bound.__qualname__, bound.__module__, bound.__doc__) == (
        "ProbeAdapter",
        "ProbeAdapter",
        __name__,
        "The probe's own docstring.",
    )
    assert issubclass(bound, ProbeAdapter) and bound.notices == ("welcome",)
    assert adapter.settings is settings and adapter.schema == "custom"
    assert ProbeAdapter.configured is None  # the class itself is left alone


def test_an_unbound_adapter_reads_its_section_when_built_and_names_a_wrong_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_PROBE_CHANNEL", "from-env")
    assert ProbeAdapter.build(OutboxSettings()).settings.channel == "from-env"

    monkeypatch.setenv("OUTBOX_PROBE_CONNECT_TIMEOUT_SECONDS", "-1")
    with pytest.raises(ConfigurationError, match="^OUTBOX_PROBE_CONNECT_TIMEOUT_SECONDS: "):
        ProbeAdapter.build(OutboxSettings())


def test_the_provider_timeout_is_declared_from_the_settings_that_bound_one_call() -> None:
    settings = ProbeSettings(connect_timeout_seconds=4, request_timeout_seconds=15)

    adapter = ProbeAdapter.bind(settings=settings).build(OutboxSettings())

    assert adapter.provider_timeout_seconds == 19.0


def test_a_provider_timeout_not_below_the_fence_margin_is_refused_naming_the_variables() -> None:
    settings = ProbeSettings(connect_timeout_seconds=5, request_timeout_seconds=25)

    with pytest.raises(ConfigurationError) as refused:
        ProbeAdapter.bind(settings=settings).build(OutboxSettings(fence_margin_seconds=30))

    assert str(refused.value).startswith(
        "OUTBOX_PROBE_CONNECT_TIMEOUT_SECONDS + OUTBOX_PROBE_REQUEST_TIMEOUT_SECONDS (30.0) must "
        "be below the fence margin (30.0 s)"
    )


def test_bind_refuses_another_section_and_a_value_the_class_does_not_have() -> None:
    with pytest.raises(TypeError, match="takes ProbeSettings, not OtherSettings"):
        ProbeAdapter.bind(settings=OtherSettings())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no class value notice"):
        ProbeAdapter.bind(notice=("typo",))


def test_a_section_names_the_variable_of_a_field() -> None:
    assert ProbeSettings.variable("request_timeout_seconds") == (
        "OUTBOX_PROBE_REQUEST_TIMEOUT_SECONDS"
    )
    assert ProbeSettings.variable() == "OUTBOX_PROBE"


async def test_per_loop_makes_one_value_per_event_loop_and_closes_only_its_own() -> None:
    made: list[object] = []
    closed: list[object] = []

    async def close(value: object) -> None:
        closed.append(value)

    def make() -> object:
        made.append(object())
        return made[-1]

    clients = PerLoop(make, close)

    def in_another_loop() -> object:
        async def get() -> object:
            return clients.get()

        return asyncio.run(get())

    other = await asyncio.to_thread(in_another_loop)
    first = clients.get()
    assert clients.get() is first and first is not other
    await clients.aclose()
    assert closed == [first]

    await asyncio.to_thread(in_another_loop)
    await clients.aclose()  # made in a loop that has ended: forgotten, not closed here
    assert closed == [first] and len(made) == 3
    assert clients.get() is made[3]


def _http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        (None, None),
        ("30", timedelta(seconds=30)),
        (" 1.5 ", timedelta(seconds=1.5)),
        ("0", timedelta(0)),
        ("-5", timedelta(0)),
        ("soon", None),
        ("nan", None),
        ("inf", None),
        ("1e20", None),
    ],
)
def test_retry_after_reads_delay_seconds(header: str | None, wait: timedelta | None) -> None:
    assert retry_after(header) == wait


def test_retry_after_reads_an_http_date_against_the_answers_date() -> None:
    date = email.utils.formatdate(1_700_000_000, usegmt=True)
    later = email.utils.formatdate(1_700_000_120, usegmt=True)

    assert retry_after(later, date=date) == timedelta(seconds=120)
    assert retry_after(date, date=later) == timedelta(0)  # a time already past: no wait
    waited = retry_after(_http_date(600))  # no Date header: this host's clock
    assert waited is not None and timedelta(0) < waited <= timedelta(seconds=600)
