"""The chaos suite's kinds, registered in code (``OUTBOX_APP_PLUGINS=tests.chaos.plugin``, run
from the repository's root): ``CHAOS_READBACK`` reads its write back before writing again,
``CHAOS_ONCE`` is at most once. Both write to the provider of :mod:`tests.chaos.provider`.

=====================================================  ===================================
what the provider did                                  result
=====================================================  ===================================
200                                                    Done, ``readback_ref`` = the effect
503 (it recorded nothing)                              Retry
connection refused or connect timeout (never sent)     Retry
no answer: dropped, timed out after the request left   Reread (``CHAOS_READBACK``);
                                                       Uncertain (``CHAOS_ONCE``)
any other status                                       Failed, ``PROVIDER_<status>``
=====================================================  ===================================

``CHAOS_READBACK`` after an earlier write of the action (``attempt.write_started``) asks the
provider for the action's effects first: one found is Done without a write; none found writes
again behind a new fence; a failed read is Reread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar, Literal

import httpx
from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    ConfiguredAdapter,
    Done,
    Failed,
    MigrationLine,
    PerLoop,
    Reread,
    Retry,
    SectionSettings,
    Uncertain,
    hookimpl,
)

READBACK_KIND = "CHAOS_READBACK"
ONCE_KIND = "CHAOS_ONCE"
KINDS = (READBACK_KIND, ONCE_KIND)
PAUSED = 300.0  # the timeout of a call that a SIGSTOP test pauses: the test decides its end


class ChaosSettings(SectionSettings):
    """Where the provider is (``OUTBOX_CHAOS_*``)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_CHAOS_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.chaos"

    provider_url: str = "http://127.0.0.1:9"
    connect_timeout_seconds: float = Field(default=1.0, gt=0)
    request_timeout_seconds: float = Field(default=2.0, gt=0)


class Write(BaseModel):
    """The action's place in its lane (1, 2, ...), which the checker compares with the ids.

    ``pause`` is for the SIGSTOP tests: the action's first attempt to reach the provider's gate
    waits there before its fence (``before_fence``), or its write waits there unapplied after
    the fence (``after_fence``), until the test releases it; later attempts pass."""

    seq: int = Field(ge=1)
    pause: Literal["before_fence", "after_fence"] | None = None


class _ChaosAdapter(ConfiguredAdapter[ChaosSettings]):
    instance_level = True
    provider_timeout_settings = ("connect_timeout_seconds", "request_timeout_seconds")
    default_max_attempts = 25
    retry_base = timedelta(milliseconds=200)
    retry_cap = timedelta(seconds=2)

    def __init__(self, settings: ChaosSettings | None = None, **options: Any) -> None:
        super().__init__(settings, **options)
        self._http = PerLoop(self._open, _close)

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Write)

    def _open(self) -> httpx.AsyncClient:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
        s = self.settings
        timeout = httpx.Timeout(
            s.request_timeout_seconds,
            connect=s.connect_timeout_seconds,
            pool=s.connect_timeout_seconds,
        )
        return httpx.AsyncClient(base_url=s.provider_url, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    def ambiguous(self) -> AdapterResult:
        """What an unanswered write is for this kind."""
        raise NotImplementedError

    async def write(self, attempt: ActionAttempt) -> AdapterResult:
        pause = attempt.payload.get("pause")
        if pause == "before_fence":
            params: dict[str, str | int] = {"key": attempt.idempotency_key, "pid": os.getpid()}
            await self._http.get().get("/gate", params=params, timeout=PAUSED)
        if not await attempt.fence().begin_write():
            return Abandoned()
        body = {
            "key": attempt.idempotency_key,
            "lane": attempt.lane_key,
            "seq": attempt.payload["seq"],
            "action_id": attempt.id,
            "epoch": attempt.epoch,
            "kind": attempt.kind,
            "pid": os.getpid(),
            "gate": pause == "after_fence",
        }
        try:
            if pause == "after_fence":
                answer = await self._http.get().post("/write", json=body, timeout=PAUSED)
            else:
                answer = await self._http.get().post("/write", json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            return Retry()  # the request never left
        except httpx.HTTPError:
            return self.ambiguous()
        if answer.status_code == 200:
            return Done(str(answer.json()["effect"]))
        if answer.status_code == 503:
            return Retry()
        return Failed(f"PROVIDER_{answer.status_code}")


class ReadBackAdapter(_ChaosAdapter):
    """Writes, and after an unanswered write reads back by the action's key."""

    kind = READBACK_KIND

    def ambiguous(self) -> AdapterResult:
        return Reread(timedelta(milliseconds=500))

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            try:
                found = await self._http.get().get(
                    "/effects", params={"key": attempt.idempotency_key, "epoch": attempt.epoch}
                )
            except httpx.HTTPError:
                return self.ambiguous()
            if found.status_code != 200:
                return self.ambiguous()
            effects = found.json()["effects"]
            if effects:
                return Done(str(effects[0]))
        return await self.write(attempt)


class AtMostOnceAdapter(_ChaosAdapter):
    """Writes once; an unanswered write is UNCERTAIN."""

    kind = ONCE_KIND
    at_most_once = True

    def ambiguous(self) -> AdapterResult:
        return Uncertain()

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return await self.write(attempt)


async def _close(client: httpx.AsyncClient) -> None:
    await client.aclose()


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(ReadBackAdapter)
    register(AtMostOnceAdapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("chaos", "tests.chaos", "migrations"))
