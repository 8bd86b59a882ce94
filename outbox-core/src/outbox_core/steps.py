"""Write a database operation once; run it from sync and from async code (a sans-I/O core).

An operation is a generator of **steps**: it yields what it needs done, is sent the answer,
and returns its result. The generator holds every check, builds every statement and reads
every row; :func:`run` (a psycopg ``Connection``) and :func:`arun` (an ``AsyncConnection``)
only execute. psycopg's own core is built the same way: generators, driven by a sync and an
async waiting function. ::

    def lane_size_steps(lane_key: str) -> Steps[int]:
        rows = yield Query("SELECT count(*) FROM outbox.agent_action WHERE lane_key = %(k)s",
                           {"k": lane_key})
        return int(rows[0][0])

    def lane_size(conn: Connection[Any], lane_key: str) -> int:
        return run(conn, lane_size_steps(lane_key))

    async def alane_size(conn: AsyncConnection[Any], lane_key: str) -> int:
        return await arun(conn, lane_size_steps(lane_key))

An error a step raises (a psycopg error, a hook's exception) is thrown into the generator at
its ``yield``, so the operation can catch it. Operations compose with ``yield from``: a plugin's
entry point runs its own statements and then ``yield from outbox.enqueue_steps(request)``, all
in the caller's transaction.

The steps:

- :class:`Query` -- run one statement; the answer is its rows (``[]`` when it returns none).
- :class:`Call` -- call code that has a sync and an async form (a notice's ``prepare`` and
  ``aprepare``, an adapter's ``ended``), with the connection as the first argument; the answer
  is what it returned.
- :class:`AsyncOnly` -- what follows needs async code (it awaits a hook that has no sync
  form): :func:`run` raises :class:`NeedsAsync` there, before the operation writes anything
  it could not finish. :func:`arun` goes on.
- :class:`Sleep` -- wait (a retry's pause).
- :class:`Savepoint` -- :func:`atomic` wraps steps in a savepoint of the caller's transaction.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg import AsyncConnection, Connection, errors
from psycopg.pq import ExecStatus, TransactionStatus

from .errors import OutboxError, PreparedStatementsLost

__all__ = [
    "AsyncOnly",
    "Call",
    "NeedsAsync",
    "Query",
    "Savepoint",
    "Sleep",
    "Step",
    "Steps",
    "arun",
    "atomic",
    "run",
]

T = TypeVar("T")

SAVEPOINT_NAME = "outbox_steps"


class NeedsAsync(OutboxError):
    """A sync call met a step that only async code can carry out (an operation that says so
    with :class:`AsyncOnly` before its first write has then written nothing)."""


@dataclass(frozen=True, slots=True)
class Query:
    """Run ``sql`` with named ``params``; the answer is the list of rows."""

    sql: str
    params: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """Call ``sync(conn, *args)`` from :func:`run`, ``await async_(conn, *args)`` from
    :func:`arun`. ``sync`` None: the call has no sync form, and :func:`run` raises
    :class:`NeedsAsync` with ``what``."""

    sync: Callable[..., Any] | None
    async_: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()
    what: str = "this call"


@dataclass(frozen=True, slots=True)
class AsyncOnly:
    """From here the operation needs async code; ``what`` says why and what to call instead."""

    what: str


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


class Savepoint(enum.Enum):
    """Open a savepoint, or end the innermost one by keeping or undoing its work."""

    OPEN = "open"
    KEEP = "keep"
    UNDO = "undo"


Step = Query | Call | AsyncOnly | Sleep | Savepoint
Steps = Generator[Step, Any, T]
"""An operation: yields steps, is sent their answers, returns a ``T``."""


def atomic(steps: Steps[T]) -> Steps[T]:
    """``steps`` inside a savepoint of the caller's transaction (in autocommit mode, inside a
    transaction of their own): when they raise, their writes are undone and the caller's
    transaction stays usable. Not ``conn.transaction()``, which on an idle connection outside
    autocommit commits when it ends: the caller's transaction is the caller's to commit."""
    yield Savepoint.OPEN
    try:
        result = yield from steps
    except BaseException:
        yield Savepoint.UNDO
        raise
    yield Savepoint.KEEP
    return result


def savepoint_sql(
    step: Savepoint, *, autocommit: bool, in_transaction: bool, levels: list[bool]
) -> list[str]:
    """The statements for one savepoint step. ``levels`` holds, per open savepoint, whether it
    is a transaction of its own (opened in autocommit mode outside a transaction)."""
    match step:
        case Savepoint.OPEN:
            own = autocommit and not in_transaction
            levels.append(own)
            return ["BEGIN"] if own else [f"SAVEPOINT {SAVEPOINT_NAME}"]
        case Savepoint.KEEP:
            return ["COMMIT"] if levels.pop() else [f"RELEASE SAVEPOINT {SAVEPOINT_NAME}"]
        case Savepoint.UNDO:
            if levels.pop():
                return ["ROLLBACK"]
            return [
                f"ROLLBACK TO SAVEPOINT {SAVEPOINT_NAME}",
                f"RELEASE SAVEPOINT {SAVEPOINT_NAME}",
            ]
    raise AssertionError(step)  # pragma: no cover


class _Driver:
    """Advances an operation: sends each answer (or throws each error) and hands back the
    next step. Shared by both shells, which differ only in how they carry a step out."""

    __slots__ = ("_conn", "_levels", "_send", "_throw", "result")

    def __init__(self, steps: Steps[Any], conn: object, *, refuse: type, message: str) -> None:
        if isinstance(conn, refuse):  # typed code cannot pass one; untyped code can
            steps.close()
            raise TypeError(message)
        self._send = steps.send
        self._throw = steps.throw
        self._conn = conn
        self._levels: list[bool] = []
        self.result: Any = None

    def advance(self, answer: Any, error: BaseException | None) -> Step | None:
        """Send the last step's answer (or throw its error) and return the next step; None once
        the operation returned (its value is ``result``)."""
        try:
            if error is None:
                return self._send(answer)
            return self._throw(_explained(error))
        except StopIteration as stop:
            self.result = stop.value
            return None

    def db(self, step: Step) -> Any:
        """The connection, for a step that needs one."""
        if self._conn is None:
            raise TypeError(f"{step!r} needs a database connection, and none was given")
        return self._conn

    def savepoint(self, step: Savepoint) -> tuple[Any, list[str]]:
        """The connection and the statements of a savepoint step."""
        db = self.db(step)
        in_transaction = db.info.transaction_status != TransactionStatus.IDLE
        statements = savepoint_sql(
            step, autocommit=db.autocommit, in_transaction=in_transaction, levels=self._levels
        )
        return db, statements


# The server session of the caller's connection lost a statement psycopg prepared on it (after
# ``prepare_threshold`` runs of the same query): PgBouncer before 1.21 in transaction mode hands
# each transaction whichever server connection is free, and psycopg's "_pg3_<n>" statement
# lives on only one of them ("does not exist") or another client's has the name ("already
# exists").
_LOST_PREPARED = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)


def _explained(error: BaseException) -> BaseException:
    """``error``, or the error that says what to do when it is a prepared statement that a
    transaction pooler lost (chained to psycopg's)."""
    if not isinstance(error, _LOST_PREPARED) or '"_pg3_' not in str(error):
        return error
    lost = PreparedStatementsLost(
        f"{error.diag.message_primary}: this connection goes through a pooler in transaction "
        "mode that does not keep prepared statements (PgBouncer before 1.21), and psycopg "
        "prepares a query once it has run prepare_threshold (5) times. Connect with "
        "prepare_threshold=None (psycopg.connect(url, prepare_threshold=None); SQLAlchemy: "
        'create_engine(url, connect_args={"prepare_threshold": None})), or give PgBouncer 1.21+ '
        "max_prepared_statements; the transaction failed and nothing was written: roll it back"
    )
    lost.__cause__ = error
    return lost


def _returns_rows(cursor: Any) -> bool:
    """Whether the statement just run returned rows (an INSERT without RETURNING does not):
    its result's status, where ``cursor.description`` would build a column object each."""
    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def run(conn: Connection[Any] | None, steps: Steps[T]) -> T:
    """Carry out ``steps`` on a sync connection (None: an operation that runs no statement)."""
    driver = _Driver(
        steps,
        conn,
        refuse=AsyncConnection,
        message="this is the sync form and got an AsyncConnection: await its async twin (the "
        "same name with an `a` in front, e.g. `await outbox.acancel(conn, ...)`)",
    )
    step = driver.advance(None, None)
    while step is not None:
        answer: Any = None
        error: BaseException | None = None
        try:
            if type(step) is Query:  # most steps are queries: tested before the match
                cursor = driver.db(step).execute(step.sql, step.params)
                answer = cursor.fetchall() if _returns_rows(cursor) else []
            else:
                match step:
                    case Call(sync=None, what=what) | AsyncOnly(what=what):
                        raise NeedsAsync(what)
                    case Call(sync=call, args=args):
                        assert call is not None
                        answer = call(conn, *args)
                    case Sleep(seconds=seconds):
                        time.sleep(seconds)
                    case Savepoint():
                        db, statements = driver.savepoint(step)
                        for sql in statements:
                            db.execute(sql)
        except BaseException as exc:
            error = exc
        step = driver.advance(answer, error)
    return driver.result  # type: ignore[no-any-return]


async def arun(conn: AsyncConnection[Any] | None, steps: Steps[T]) -> T:
    """Carry out ``steps`` on an async connection: the async twin of :func:`run`."""
    driver = _Driver(
        steps,
        conn,
        refuse=Connection,
        message="this is the async form and got a sync Connection: call its sync twin (the "
        "same name without the `a` in front)",
    )
    step = driver.advance(None, None)
    while step is not None:
        answer: Any = None
        error: BaseException | None = None
        try:
            if type(step) is Query:  # most steps are queries: tested before the match
                cursor = await driver.db(step).execute(step.sql, step.params)
                answer = await cursor.fetchall() if _returns_rows(cursor) else []
            else:
                match step:
                    case Call(async_=call, args=args):
                        answer = await call(conn, *args)
                    case AsyncOnly():
                        pass
                    case Sleep(seconds=seconds):
                        await asyncio.sleep(seconds)
                    case Savepoint():
                        db, statements = driver.savepoint(step)
                        for sql in statements:
                            await db.execute(sql)
        except BaseException as exc:
            error = exc
        step = driver.advance(answer, error)
    return driver.result  # type: ignore[no-any-return]
