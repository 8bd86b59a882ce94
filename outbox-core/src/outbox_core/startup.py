"""Which kinds can run with these settings: each kind's adapter is built, and a kind whose
adapter cannot be built (its plugin's settings are invalid, or invalid against the core's,
or its construction raised) is stopped, not every kind.

The executor builds the adapters of the kinds it serves when it opens: a stopped kind is
logged (``executor.kind.stopped``), counted by the gauge ``executor.kind.stopped``, and its
actions stay queued for an executor that can run them. With ``OUTBOX_STRICT_STARTUP`` (or
``outbox run --strict``) the executor refuses to open instead. ``outbox status`` builds the
adapters the same way, with the settings it sees, and lists the kinds that cannot run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from .adapter import ActionAdapter, check_built
from .errors import ConfigurationError, OutboxError
from .registry import KindRegistry, RegisteredKind
from .settings import OutboxSettings, validation_problems


@dataclass(frozen=True, slots=True)
class StoppedKind:
    """A kind whose adapter could not be built, who registered it, and why."""

    kind: str
    distribution: str
    error: str


def build_error(exc: BaseException) -> str:
    """One line about a failed build, without input values (a settings value may be secret)."""
    if isinstance(exc, ValidationError):
        return f"{exc.title}: {validation_problems(exc)}"
    if isinstance(exc, OutboxError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def build_adapters(
    entries: Mapping[str, RegisteredKind], settings: OutboxSettings
) -> tuple[dict[str, ActionAdapter], list[StoppedKind]]:
    """Each kind's adapter, and the kinds whose adapter could not be built."""
    adapters: dict[str, ActionAdapter] = {}
    stopped: list[StoppedKind] = []
    for kind, entry in sorted(entries.items()):
        try:
            adapters[kind] = check_built(entry.adapter, entry.adapter.build(settings))
        except Exception as exc:
            stopped.append(StoppedKind(kind, entry.distribution, build_error(exc)))
    return adapters, stopped


def refusal(stopped: list[StoppedKind], *, strict: bool) -> ConfigurationError:
    """The error of an executor that will not open: strict start-up found kinds that cannot
    run, or (``strict=False``) no kind it serves can run."""
    each = "; ".join(f"{s.kind} (from {s.distribution}): {s.error}" for s in stopped)
    if strict:
        return ConfigurationError(
            f"strict start-up: {len(stopped)} kind(s) cannot run with these settings: {each}. "
            "Fix the settings, or start without OUTBOX_STRICT_STARTUP / --strict to run the "
            "other kinds and leave these queued"
        )
    return ConfigurationError(
        f"no kind this executor serves can run with these settings: {each}. Fix the settings "
        "(`outbox status` lists the kinds that cannot run)"
    )


async def acheck_kinds(registry: KindRegistry, settings: OutboxSettings) -> list[StoppedKind]:
    """The kinds of ``registry`` that an executor with ``settings`` would stop. Builds each
    adapter and closes it again (an adapter opens provider connections only in attempts)."""
    adapters, stopped = build_adapters({entry.kind: entry for entry in registry}, settings)
    for adapter in adapters.values():
        # A check: a failed close of an adapter that ran nothing is not news.
        with contextlib.suppress(Exception):
            await adapter.aclose()
    return stopped


def check_kinds(registry: KindRegistry, settings: OutboxSettings) -> list[StoppedKind]:
    """The sync twin of :func:`acheck_kinds` (run on a thread of its own, so that it also
    works where an event loop is running)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="outbox-check") as pool:
        return pool.submit(asyncio.run, acheck_kinds(registry, settings)).result()
