"""The adapter contract: one adapter per kind, and the only code that calls a provider.

Only the executor calls :meth:`ActionAdapter.execute` (the specification's egress rule): the
method is guarded at run time, and ``tests/test_egress.py`` refuses any call in the source of
the outbox packages outside ``outbox_core.executor``.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar, cast

from .errors import AdapterContractError, ConfigurationError, EgressViolation, RegistrationError

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Connection
    from pydantic import BaseModel

    from .action import Action
    from .attempt import ActionAttempt
    from .requests import ActionRequest
    from .results import AdapterResult, Defer, Retry
    from .settings import OutboxSettings
    from .settings_section import SectionSettings
    from .variants import ActionVariants

S = TypeVar("S", bound="SectionSettings")
T = TypeVar("T")

KIND_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,62}$")

# Set by the executor around each call of execute(); nothing else sets it.
_egress_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "outbox_egress_allowed", default=False
)


@dataclass(frozen=True, slots=True)
class EnqueueCheck:
    """What a kind's enqueue check (:meth:`ActionAdapter.check_enqueue`) is handed: the request,
    its payload as it will be stored (JSON), that payload decoded as the executor will decode
    it (the variant's model), and the schema of the ``Outbox`` that enqueues it (where the
    plugin's own rows are, for a check that reads them)."""

    request: ActionRequest
    payload: dict[str, Any]
    body: BaseModel
    schema: str


class ActionAdapter(abc.ABC):
    """Carries out the actions of one kind.

    Class attributes declare the kind; ``variants()`` declares what it decodes (required);
    ``build()`` makes the instance the executor uses (import provider SDKs there, not at module
    level, so ``outbox migrate`` stays light).
    """

    kind: ClassVar[str]
    at_most_once: ClassVar[bool] = False
    """The provider cannot be read back: never claimed again once its write started."""
    instance_level: ClassVar[bool] = False
    """Actions of this kind may have no workspace (an email to an account)."""
    retained: ClassVar[bool] = True
    """False: the retention sweep leaves ended actions of this kind to the kind's own event."""
    stop_reasons: ClassVar[frozenset[str]] = frozenset()
    """Stop reasons this kind uses beyond the core's (``StopReason``)."""
    max_concurrency: int | None = None
    """Attempts of this kind running at once in one executor (None: only the global limit).
    A class value, or set by an adapter instance from its settings (the executor reads the
    built adapter's)."""
    writes_outside: ClassVar[bool] = True
    """False: an attempt writes nothing outside the database (a model call whose answer the
    adapter keeps under the lease): it needs no fence, a repeated attempt costs only the call,
    and there is nothing to read back. Such a kind is never ``at_most_once``; the conformance
    suite (:mod:`outbox_core.testing.conformance`) checks it by that profile."""
    writes_again_when_absent: ClassVar[bool] = True
    """For a read-back kind: True, an attempt that starts with ``write_started`` and finds no
    earlier write writes; False, such an attempt only reads, and an effect it proves absent
    ends the action ``CANCELLED`` with ``ABSENT``, never written then (``SLACK_POST``: the
    specification's "an attempt after an unknown write only reads the history"). The
    conformance suite checks the kind by it; the executor does not read it."""
    provider_timeout_seconds: float | None = None
    """How long one provider call of an attempt may take at most, in seconds: the adapter's own
    timeout, which must end the call before the fence margin (``fence_margin_seconds``, 60 s by
    default) runs out, as the specification's "the provider call must end within those 60
    seconds" asks. A class value, or set by an adapter instance from its settings. None:
    undeclared; the executor does not read it, and the conformance suite fails the adapter."""
    retry_base: ClassVar[timedelta] = timedelta(seconds=5)
    retry_cap: ClassVar[timedelta] = timedelta(minutes=30)
    unreadable_for: ClassVar[timedelta] = timedelta(minutes=15)
    """For a read-back kind: how long the provider may stay unreadable after a write may have
    started (from the action's ``write_started_at`` to an attempt's claim, both on the
    database clock) before the action is given up as uncertain. An attempt that only reads and
    returns ``Reread`` spends no attempt; once this has passed, it ends the action UNCERTAIN
    with ``READBACK_UNAVAILABLE``. Set it from the provider's documented outages."""
    reread_base: ClassVar[timedelta] = timedelta(seconds=1)
    """The shortest wait the core picks after a ``Reread`` without ``after``."""
    reread_cap: ClassVar[timedelta] = timedelta(minutes=2)
    """The longest wait the core picks after a ``Reread`` without ``after``: between the two,
    the wait grows with jitter as the action waits on reads (about half to all of the time
    it has waited since its write started)."""
    default_max_attempts: ClassVar[int] = 5

    @classmethod
    def variants(cls) -> ActionVariants:
        """What this adapter decodes. There is no default: every adapter declares it."""
        raise RegistrationError(
            f"{cls.__module__}.{cls.__qualname__} declares no variants(): say what it decodes "
            "with ActionVariants.one(Model), .tagged(tag, body, bodies) "
            "or .key_suffix(values, Model)"
        )

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        """The instance the executor calls. Override to read your package's settings."""
        return cls()

    @abc.abstractmethod
    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        """Carry out one attempt. Call ``await attempt.fence().begin_write()`` just before the
        provider write and return ``Abandoned()`` when it refuses."""

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        """The kind's own check of a request, in the caller's transaction, before anything is
        written: raise (an :class:`~outbox_core.InvalidRequest`, naming the field) to refuse it.
        Every enqueue path calls it for its kind: ``enqueue``, ``enqueue_many`` (a refused
        request refuses the whole batch), ``admit`` (for the stored proposal) and the plugins'
        entry points built on them. It only decides: it reads (through ``conn``, which sees the
        caller's uncommitted rows) and never writes or calls a provider.

        Sync callers run this one, async callers :meth:`acheck_enqueue`: override both (an
        adapter that overrides only this one is refused at registration), or only
        :meth:`acheck_enqueue` when the check has no sync form (then the sync paths raise
        :class:`~outbox_core.steps.NeedsAsync` with nothing written). A kind that overrides
        neither is not called and costs nothing."""

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        """The async twin of :meth:`check_enqueue`, run by ``aenqueue``, ``aenqueue_many`` and
        ``aadmit``."""

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        """Called in the transaction that ended an action of this kind, however it ended
        (attempt, expiry, reaper). Move the domain row on here; never call a provider. Two
        batches of endings may be written at once, so calls for different actions can overlap
        in two transactions (as they can across replicas): lock the domain rows you change.
        A hook that raises rolls its ending back (the batch's other endings are written
        without it); the executor writes it again after a pause, a few times, then leaves it
        to the lease: take a row an application may hold under a short ``lock_timeout``."""

    async def rescheduled(
        self, conn: AsyncConnection[Any], action: Action, result: Retry | Defer
    ) -> None:
        """Called in the transaction that makes the action wait again after ``Retry`` or
        ``Defer`` (a domain event such as DRAFT_DEFERRED belongs here)."""

    async def aclose(self) -> None:
        """Called once when the executor that built this instance closes: release what the
        adapter keeps between attempts (pooled provider connections). Writes no effect."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("execute")
        if (
            own is not None
            and not getattr(own, "__isabstractmethod__", False)
            and not getattr(own, "_outbox_guarded", False)
        ):
            setattr(cls, "execute", _guard(own))  # noqa: B010 (mypy: a method replaced on purpose)


class ConfiguredAdapter(ActionAdapter, Generic[S]):
    """Base of an adapter with a settings section of its own (``OUTBOX_EMAIL_*``,
    ``[outbox.email]``): ``class EmailAdapter(ConfiguredAdapter[EmailSettings])``.

    The type argument is the package's :class:`~outbox_core.SectionSettings`. An instance's
    ``settings`` are those given, else those the class was bound to (:meth:`bind`: what a
    test or a loopback helper registers), else the environment and the TOML file, read when
    the adapter is built (``load()``: a :class:`~outbox_core.ConfigurationError` naming each
    wrong variable, never its value). ``provider_timeout_settings`` names the fields whose sum
    bounds one provider call: the instance declares it as ``provider_timeout_seconds``, and
    refuses to be made when it is not below the fence margin, naming the variables.
    """

    settings_class: ClassVar[type[SectionSettings]]
    """The settings section (set from the type argument)."""
    configured: ClassVar[SectionSettings | None] = None
    """Settings that the adapter uses instead of the environment (set by :meth:`bind`)."""
    provider_timeout_settings: ClassVar[tuple[str, ...]] = ()
    """The settings fields whose values, added up, bound one provider call after the fence
    (``("send_timeout_seconds",)``; a connect and a request timeout for an HTTP call)."""

    settings: S

    def __init__(
        self,
        settings: S | None = None,
        *,
        schema: str = "outbox",
        fence_margin_seconds: float = 60.0,
    ) -> None:
        self.settings = settings if settings is not None else type(self).section_settings()
        self.schema = schema
        fields = self.provider_timeout_settings
        if fields:
            timeout = sum((float(getattr(self.settings, field)) for field in fields), 0.0)
            if timeout >= fence_margin_seconds:
                names = " + ".join(self.settings.variable(field) for field in fields)
                raise ConfigurationError(
                    f"{names} ({timeout}) must be below the fence margin ({fence_margin_seconds} "
                    "s): the provider call has to end within the lease that begin_write() "
                    "guarantees"
                )
            self.provider_timeout_seconds = timeout

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is ConfiguredAdapter:
                (argument,) = typing.get_args(base)
                if isinstance(argument, type):
                    cls.settings_class = argument

    @classmethod
    def section_settings(cls) -> S:
        """The settings this class was bound to, else the section's from the environment and
        the file (a :class:`~outbox_core.ConfigurationError` naming each wrong variable)."""
        configured = cls.configured
        return cast(S, configured if configured is not None else cls.settings_class.load())

    @classmethod
    def bind(cls, *, settings: S | None = None, **values: Any) -> type[Self]:
        """This class again, under the same name, module and docstring, bound to ``settings``
        instead of the environment, and to the other class values the package binds (``notices``
        for ``EMAIL``): what a plugin registers, and what a test registers for one test."""
        if settings is not None and not isinstance(settings, cls.settings_class):
            raise TypeError(
                f"{cls.__qualname__}.bind(settings=...) takes {cls.settings_class.__qualname__}, "
                f"not {type(settings).__qualname__}"
            )
        unknown = sorted(name for name in values if not hasattr(cls, name))
        if unknown:
            raise TypeError(f"{cls.__qualname__} has no class value {', '.join(unknown)} to bind")
        attributes = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "configured": settings,
            **values,
        }
        return cast(type[Self], type(cls.__name__, (cls,), attributes))

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        """An instance with the class's settings (see above), the core's schema and fence margin.
        Override to import the provider's SDK first, then call ``super().build(settings)``."""
        return cls(schema=settings.schema_name, fence_margin_seconds=settings.fence_margin_seconds)


class PerLoop(Generic[T]):
    """What an adapter keeps between attempts in one event loop: pooled provider connections,
    an HTTP client. They belong to the loop that opened them, so a running loop that is not
    theirs (a test's next loop, an executor opened again) gets new ones from ``make``.

    ``adapter.aclose()`` calls :meth:`aclose`: it closes them with ``close`` in their own loop,
    and forgets those of a loop that is not running (they cannot be closed from another)."""

    def __init__(self, make: Callable[[], T], close: Callable[[T], Awaitable[None]]) -> None:
        self._make = make
        self._close = close
        self._value: T | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> T:
        """The running loop's value, made on first use."""
        loop = asyncio.get_running_loop()
        if self._value is None or self._loop is not loop:
            self._value, self._loop = self._make(), loop
        return self._value

    async def aclose(self) -> None:
        if self._value is not None and self._loop is _running_loop():
            await self._close(self._value)
        self._value = self._loop = None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _guard(
    execute: Callable[[Any, ActionAttempt], Awaitable[AdapterResult]],
) -> Callable[[Any, ActionAttempt], Awaitable[AdapterResult]]:
    @functools.wraps(execute)
    async def guarded(self: ActionAdapter, attempt: ActionAttempt) -> AdapterResult:
        if not _egress_allowed.get():
            raise EgressViolation(
                f"{type(self).__qualname__}.execute() was called outside the executor; enqueue "
                "an action instead (outbox_core.enqueue) and let the executor carry it out"
            )
        return await execute(self, attempt)

    guarded._outbox_guarded = True  # type: ignore[attr-defined]
    return guarded


_ASYNC_METHODS = ("execute", "ended", "rescheduled", "aclose", "acheck_enqueue")
_CLASS_VALUES: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("at_most_once", bool, "True or False"),
    ("instance_level", bool, "True or False"),
    ("retained", bool, "True or False"),
    ("retry_base", timedelta, "a timedelta"),
    ("retry_cap", timedelta, "a timedelta"),
    ("unreadable_for", timedelta, "a timedelta"),
    ("reread_base", timedelta, "a timedelta"),
    ("reread_cap", timedelta, "a timedelta"),
)


def adapter_class_problems(adapter: type[ActionAdapter]) -> list[str]:
    """What is wrong with an adapter class's declarations: the values and methods the executor
    trusts without looking again (an ``ended`` written without ``async`` runs, then fails at
    its await, and its ending is rolled back on every try)."""
    name = adapter.__qualname__
    problems = []
    for method in _ASYNC_METHODS:
        function = inspect.unwrap(getattr(adapter, method))
        if not inspect.iscoroutinefunction(function):
            problems.append(f"{name}.{method} must be an `async def` method")
    for attribute, types, wanted in _CLASS_VALUES:
        value = getattr(adapter, attribute)
        if not isinstance(value, types):
            problems.append(
                f"{name}.{attribute} is {type(value).__qualname__}; it must be {wanted}"
            )
    check = adapter.check_enqueue
    if inspect.iscoroutinefunction(inspect.unwrap(getattr(check, "__func__", check))):
        problems.append(
            f"{name}.check_enqueue must be a plain method (the sync form); write the async "
            "form as acheck_enqueue"
        )
    elif has_own(adapter, "check_enqueue") and not has_own(adapter, "acheck_enqueue"):
        problems.append(
            f"{name} overrides check_enqueue but not acheck_enqueue: write the async form too "
            "(aenqueue runs it), or only acheck_enqueue when the check has no sync form"
        )
    problems.extend(_reread_problems(adapter))
    attempts = adapter.default_max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        problems.append(f"{name}.default_max_attempts must be a whole number of at least 1")
    reasons = adapter.stop_reasons
    if not isinstance(reasons, frozenset | set) or not all(isinstance(r, str) for r in reasons):
        problems.append(f"{name}.stop_reasons must be a frozenset of str")
    problem = _limit_problem(name, adapter.max_concurrency)
    if problem is not None:
        problems.append(problem)
    return problems


def _reread_problems(adapter: type[ActionAdapter]) -> list[str]:
    """What is wrong with the read-back waits and window (their types are checked above)."""
    name, zero = adapter.__qualname__, timedelta(0)
    values = (adapter.reread_base, adapter.reread_cap, adapter.unreadable_for)
    if not all(isinstance(value, timedelta) for value in values):
        return []
    if adapter.reread_base <= zero or adapter.reread_cap < adapter.reread_base:
        return [
            f"{name}.reread_base ({adapter.reread_base}) must be above zero and at most "
            f"reread_cap ({adapter.reread_cap})"
        ]
    if adapter.unreadable_for <= zero:
        return [f"{name}.unreadable_for ({adapter.unreadable_for}) must be above zero"]
    return []


def has_own(adapter: type[ActionAdapter], hook: str) -> bool:
    """Whether the adapter class has its own ``ended``, ``rescheduled``, ``check_enqueue`` or
    ``acheck_enqueue`` (the base ones do nothing, and the core skips what they would cost)."""
    mine, base = getattr(adapter, hook), getattr(ActionAdapter, hook)
    # A classmethod is bound anew at each lookup: compare the functions.
    return getattr(mine, "__func__", mine) is not getattr(base, "__func__", base)


def check_built(adapter: type[ActionAdapter], built: object) -> ActionAdapter:
    """The instance ``build()`` returned, checked: an instance of the kind's adapter class, with
    a ``max_concurrency`` the executor can use (None, or a whole number of at least 1)."""
    if not isinstance(built, adapter):
        raise AdapterContractError(
            f"{adapter.__qualname__}.build() returned {type(built).__qualname__}, not an instance "
            f"of {adapter.__qualname__}: return cls(...)"
        )
    problem = _limit_problem(f"{adapter.__qualname__} (built)", built.max_concurrency)
    if problem is not None:
        raise AdapterContractError(problem)
    return built


def _limit_problem(name: str, limit: object) -> str | None:
    if limit is None or (type(limit) is int and limit >= 1):
        return None
    return (
        f"{name}.max_concurrency is {limit!r}; it must be None (only the executor's limit) or a "
        "whole number of at least 1"
    )


def egress_token() -> contextvars.Token[bool]:
    """For the executor only: allow execute() in the current context."""
    return _egress_allowed.set(True)


def egress_reset(token: contextvars.Token[bool]) -> None:
    _egress_allowed.reset(token)
