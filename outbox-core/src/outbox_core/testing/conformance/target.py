"""What a plugin author hands the conformance suite: the target (the test database, the kind,
a request factory) and the loopback provider's side (:class:`LoopbackProvider`)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

from ...adapter import ActionAdapter
from ...requests import ActionRequest

if TYPE_CHECKING:
    from ..database import OutboxTestDatabase

Fault = Literal["refuse", "drop", "stall", "unreadable"]
"""What the loopback provider does to the next write: ``refuse`` it before it is recorded (a
transient refusal: the provider provably holds nothing, such as a 503 or an SMTP 451),
``drop`` the connection after recording it (the client sees a disconnect or an error), or
``stall`` after recording it (the answer never comes; the adapter's own timeout must end the
call). ``unreadable`` is a switch, not a fault of the next write: from then until
``clear_faults()``, every read the adapter makes to find an earlier write fails as the
provider's outages do (a 5xx, a dropped listing), and writes are untouched. The suite uses
it on read-back kinds only; a provider that has no read of its own (a receiver that dedupes on
the idempotency key, so that writing again is the read-back) raises ``NotImplementedError``
for it, and the suite leaves out what it would check."""


class LoopbackProvider(Protocol):
    """The provider's side, as the suite reads and steers it. The server runs in a thread of its
    own (the suite drives the executor with ``asyncio.run``), on loopback, speaking the real
    protocol."""

    def requests(self) -> int:
        """Every request that reached the server so far: reads, writes, connections."""
        ...

    def writes(self, request: ActionRequest) -> int:
        """How many effects the provider holds for this action (found by its idempotency key
        or marker). For a kind that writes nothing outside: how many calls it served."""
        ...

    def fault(self, fault: Fault) -> None:
        """Make the next write fail so (see :data:`Fault`); later writes succeed again. For
        ``unreadable``: make every read-back fail until :meth:`clear_faults`."""
        ...

    def clear_faults(self) -> None: ...


class RequestingProvider(LoopbackProvider, Protocol):
    """A loopback provider that also makes the suite's requests (a package's own provider
    class, which stores what a request needs first)."""

    def request(self, db: OutboxTestDatabase, key: str, canary: str) -> ActionRequest:
        """A valid request of the kind with idempotency key ``key`` whose payload holds
        ``canary`` (see :attr:`ConformanceTarget.request`)."""
        ...


@dataclass
class ConformanceTarget:
    """What a plugin author hands the suite.

    - ``db``: the test database with the kind registered as the application would run it
      (pointed at the loopback provider);
    - ``kind``: the kind under test;
    - ``provider``: the loopback provider (:class:`LoopbackProvider`);
    - ``request(key, canary)``: a valid :class:`ActionRequest` of the kind whose idempotency key
      is ``key`` (or begins with it: a kind whose variant is the key's last segment appends
      one) and whose payload holds the string ``canary`` somewhere (the suite checks that no
      log record repeats it); it must succeed when the provider is well. The suite's actions
      run one after another, so they may share a lane;
    - ``invalid_payloads``: payloads that enqueue must refuse, beyond those the suite derives
      from ``variants()`` (an unknown tag, a payload without its required fields);
    - ``resolved_ref``: a provider reference in the kind's ``readback_ref`` form (an issue's
      URL), which the check of an operator's ``resolve --done`` gives.
    """

    db: OutboxTestDatabase
    kind: str
    provider: LoopbackProvider
    request: Callable[[str, str], ActionRequest]
    invalid_payloads: Sequence[Mapping[str, Any]] = ()
    resolved_ref: str = "conformance-ref"

    @classmethod
    def of(
        cls,
        db: OutboxTestDatabase,
        kind: str,
        provider: RequestingProvider,
        *,
        resolved_ref: str = "conformance-ref",
    ) -> Self:
        """The target whose requests ``provider`` makes (``provider.request(db, key, canary)``);
        ``resolved_ref`` as the field of that name says."""
        return cls(
            db=db,
            kind=kind,
            provider=provider,
            request=lambda key, canary: provider.request(db, key, canary),
            resolved_ref=resolved_ref,
        )


class ConformanceFailure(AssertionError):
    """The adapter under test broke a rule of the contract; the message names the rule."""


class Profile(enum.StrEnum):
    """How the suite checks a kind, from its declarations."""

    READ_BACK = "read-back"
    AT_MOST_ONCE = "at-most-once"
    NOTHING_OUTSIDE = "writes nothing outside"

    @classmethod
    def of(cls, adapter: type[ActionAdapter]) -> Profile:
        if not adapter.writes_outside:
            return cls.NOTHING_OUTSIDE
        return cls.AT_MOST_ONCE if adapter.at_most_once else cls.READ_BACK
