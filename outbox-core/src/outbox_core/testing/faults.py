"""The fault switches of the loopback fakes (:mod:`outbox_core.testing.loopback_http`), the
same in each package's fake; what a fault answers (a provider's error shape) stays in the
fake.

- :class:`Fault` and :class:`FaultQueue`: faults set for one operation (``create_issue``,
  ``chat.postMessage``, a completion) for its next ``times`` requests, or until cleared
  (``times=None``), taken in the order they were set.
- :class:`Outage`: an operation's requests refused for some seconds on the monotonic clock
  (a minute or more: longer than a client's retries), or until ended, counting what it refused.
- :class:`NewWrites`: new writes hidden from reads for some reads, some seconds, or until
  revealed (a provider's listings lagging behind its writes).
- :func:`retry_after`: the ``Retry-After`` header of a rate limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["Fault", "FaultQueue", "NewWrites", "Outage", "retry_after"]

T = TypeVar("T")


@dataclass
class Fault:
    """One fault: what ``op``'s next ``times`` requests get (``mode`` names it; ``times=None``:
    until cleared). ``status``, ``body`` and ``headers`` are an answer's; ``seconds`` a stall's
    length (None: the server's); ``detail`` what else the fake needs (an error code)."""

    op: str
    mode: str
    times: int | None = 1
    status: int = 500
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None
    detail: Any = None


class FaultQueue(Generic[T]):
    """Faults (of any type) by operation, each for a number of requests or until cleared.

    :meth:`take` gives the first fault set for an operation and counts one use of it; the
    fault leaves the queue when its uses are spent. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[list[Any]] = []

    def add(self, op: str, fault: T, times: int | None = 1) -> None:
        """``fault`` for the next ``times`` requests of ``op`` (None: until :meth:`clear`)."""
        if times is not None and times < 1:
            raise ValueError(f"times={times}: a fault is for one request or more (or None)")
        with self._lock:
            self._entries.append([op, fault, times])

    def take(self, op: str) -> T | None:
        """The fault for this request of ``op`` (None: no fault is set for it)."""
        with self._lock:
            for entry in self._entries:
                if entry[0] == op:
                    if entry[2] is not None:
                        entry[2] -= 1
                        if entry[2] <= 0:
                            self._entries.remove(entry)
                    fault: T = entry[1]
                    return fault
        return None

    def pending(self) -> list[T]:
        """The faults not spent yet, in the order they were set."""
        with self._lock:
            return [entry[1] for entry in self._entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@dataclass
class Outage:
    """Requests of ``ops`` (None: of every operation) refused until ``until`` (monotonic
    seconds; ``math.inf``: until :meth:`end`). ``how``, ``status`` and ``detail`` say how the
    fake refuses them; :attr:`answered` counts the requests refused."""

    until: float
    ops: frozenset[str] | None = None
    how: str = "5xx"
    status: int = 503
    detail: Any = None
    answered: int = 0

    @classmethod
    def lasting(
        cls, seconds: float | None, *, ops: Collection[str] | None = None, **how: Any
    ) -> Outage:
        """An outage from now for ``seconds`` (None: until :meth:`end`)."""
        until = math.inf if seconds is None else time.monotonic() + seconds
        return cls(until, None if ops is None else frozenset(ops), **how)

    def covers(self, op: str) -> bool:
        """True while the outage lasts and ``op`` is one it refuses."""
        return (self.ops is None or op in self.ops) and time.monotonic() < self.until

    def refuses(self, op: str) -> bool:
        """:meth:`covers`, counting the request in :attr:`answered` when it does."""
        if not self.covers(op):
            return False
        self.answered += 1
        return True

    def end(self) -> None:
        self.until = 0.0


class NewWrites:
    """Whether writes from now on are hidden from reads: for their next ``reads`` reads, for
    ``seconds``, or until the fake reveals them (``until_revealed``)."""

    def __init__(self) -> None:
        self.reads = 0
        self.seconds = 0.0
        self.until_revealed = False

    def hide(self, *, reads: int = 0, seconds: float = 0.0, until_revealed: bool = False) -> None:
        if reads < 0 or seconds < 0:
            raise ValueError(f"reads={reads}, seconds={seconds}: neither can be negative")
        self.reads, self.seconds, self.until_revealed = reads, seconds, until_revealed

    def show(self) -> None:
        """Writes from now on are read at once."""
        self.hide()

    def hidden_until(self) -> float:
        """The monotonic moment until which a write made now is hidden (0.0: not hidden)."""
        return time.monotonic() + self.seconds if self.seconds else 0.0


def retry_after(seconds: float | None) -> dict[str, str]:
    """The ``Retry-After`` header for ``seconds`` (none for None)."""
    return {} if seconds is None else {"retry-after": f"{seconds:g}"}
