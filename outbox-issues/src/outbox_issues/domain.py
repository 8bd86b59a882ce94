"""The report and its filing: the domain rows the issue kinds move, and their one state table.

A **report** is a person's feedback on the product (workspace, reporter, title, text): person
data, deleted by an erasure of the reporter. Its **filing** carries it to the tracker, in
generations (an edit or a re-draft starts one), and holds no person data except the draft's
answer, which an erasure clears. The filing's states and their allowed transitions are
:data:`TRANSITIONS`; the trigger ``guard_issue_filing`` (``migrations/0001_issues.sql``)
refuses every other change of state, and ``tests/test_filing_trigger.py`` tries every ordered
pair against it.

The package README draws the diagram and says when each transition happens.

The ``ended`` hooks move the filing: ``FILE_ISSUE`` DONE to FILED with the issue's number and
URL; FAILED, UNCERTAIN or CANCELLED to STOPPED with the stop reason. ``outbox-draft`` moves it
through the drafting states with :func:`draft_claimed`, :func:`draft_deferred`,
:func:`keep_answer`, :func:`drop_answer` and :func:`draft_ended`.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import ActionRequest, Outbox, package_queries


class FilingState(enum.StrEnum):
    """Where a report's filing is. The value is what the ``state`` column holds."""

    NEW = "NEW"
    """Stored; nothing has run yet."""
    DRAFT_CLAIMED = "DRAFT_CLAIMED"
    """A claim of the draft (``DRAFT_REPORT``) took it."""
    DRAFT_WAITING = "DRAFT_WAITING"
    """The draft was deferred (the model's capacity): it waits without spending an attempt."""
    ANSWERED = "ANSWERED"
    """The draft ended (with an answer kept only when it was DONE)."""
    FILING = "FILING"
    """``FILE_ISSUE`` is writing the issue (or may have written it)."""
    FILED = "FILED"
    """The issue exists: its number and URL are on the filing."""
    STOPPED = "STOPPED"
    """``FILE_ISSUE`` ended FAILED, UNCERTAIN or CANCELLED: ``stop_reason`` says why. Final,
    but for ``CONTENT_REFUSED`` (nothing was filed), which an edit files again (NEW)."""


S = FilingState
# Changes of state between two different states; an update that keeps its state is allowed.
TRANSITIONS: dict[FilingState, frozenset[FilingState]] = {
    S.NEW: frozenset({S.DRAFT_CLAIMED, S.ANSWERED, S.FILING, S.STOPPED}),
    S.DRAFT_CLAIMED: frozenset({S.DRAFT_WAITING, S.ANSWERED, S.STOPPED}),
    S.DRAFT_WAITING: frozenset({S.DRAFT_CLAIMED, S.ANSWERED, S.STOPPED}),
    S.ANSWERED: frozenset({S.FILING, S.FILED, S.STOPPED}),
    S.FILING: frozenset({S.FILED, S.STOPPED}),
    # A re-draft of a filed report: the draft moves it, PUBLISH_REPORT brings it back.
    S.FILED: frozenset({S.DRAFT_CLAIMED, S.DRAFT_WAITING, S.ANSWERED}),
    # GitHub refused the content (CONTENT_REFUSED): an edit files a new generation.
    S.STOPPED: frozenset({S.NEW}),
}


def allows(old: FilingState, new: FilingState) -> bool:
    """Whether an update of a filing in ``old`` that leaves it in ``new`` is allowed."""
    return old is new or new in TRANSITIONS[old]


def sources(target: FilingState) -> list[str]:
    """The states that may become ``target`` (itself included), for conditional updates: an
    ``ended`` hook never raises on a filing that moved elsewhere meanwhile."""
    return sorted(str(state) for state in FilingState if allows(state, target))


def lane(report_id: str) -> str:
    """The report's lane: every action of the report runs in it, in id order."""
    return f"file_issue:{report_id}"


def file_key(report_id: str, generation: int) -> str:
    return f"file_issue:{report_id}:{generation}"


def publish_key(report_id: str, generation: int) -> str:
    return f"publish:{report_id}:{generation}"


def transfer_key(report_id: str) -> str:
    return f"transfer:{report_id}"


def cleanup_key(report_id: str) -> str:
    return f"cleanup:{report_id}"


def queries(schema: str) -> dict[str, str]:
    """This package's named statements with the schema filled in."""
    return package_queries("outbox_issues", "sql/queries.sql", schema)


@dataclass(frozen=True, slots=True)
class Filing:
    """A report's filing as the application sees it."""

    report_id: str
    workspace_id: str
    state: FilingState
    generation: int
    repository: str | None
    issue_number: int | None
    issue_url: str | None
    issue_node_id: str | None
    filed_generation: int | None
    published_generation: int | None
    private: bool
    stop_reason: str | None
    stopped_by: str | None
    last_error: str | None
    erased: bool
    scrubbed: bool
    issue_deleted: bool
    history_retains_text: bool
    draft_generation: int | None
    has_draft: bool
    delete_refused: str | None = None
    """Why the tracker refused to delete the issue after an erasure (the cleanup scrubbed it
    instead): ``OUTBOX_ISSUES_DELETE_ON_ERASURE`` asked for a delete that did not happen."""
    still_published: str | None = None
    """What of the erased reporter's is still published on the tracker, and where: set by the
    erasure, narrowed by the cleanup (its edit history after a scrub), None when nothing is."""

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Filing:
        values = list(row)
        values[2] = FilingState(values[2])
        values[14] = values[14] is not None
        values[15] = values[15] is not None
        return cls(*values)


# -- one body of code for the sync and the async API --------------------------------------------
#
# A step function is a generator that yields what it needs from the database (a named
# statement, an enqueue, a cancel) and receives the answer; run_sync and run_async drive it on
# a sync or an async connection, so both APIs share every decision.


@dataclass(frozen=True, slots=True)
class Sql:
    name: str
    params: dict[str, Any]
    fetch: str = "all"  # "all", "one" or "none"


@dataclass(frozen=True, slots=True)
class Enqueue:
    request: ActionRequest


@dataclass(frozen=True, slots=True)
class Check:
    """Every check an enqueue of ``requests`` makes, their kinds' own included, writing
    nothing: yielded before an entry point's first write, so that a refusal leaves nothing."""

    requests: tuple[ActionRequest, ...]


@dataclass(frozen=True, slots=True)
class Cancel:
    action_id: int
    reason: str


Step = Sql | Enqueue | Check | Cancel
Steps = Generator[Step, Any, Any]


def run_sync(conn: Connection[Any], outbox: Outbox, steps: Steps) -> Any:
    """Drive ``steps`` on a sync connection (the caller's transaction)."""
    answer: Any = None
    named = queries(outbox.schema)
    try:
        while True:
            step = steps.send(answer)
            match step:
                case Sql(name=name, params=params, fetch=fetch):
                    cursor = conn.execute(named[name], params)
                    answer = (
                        cursor.fetchall()
                        if fetch == "all"
                        else cursor.fetchone()
                        if fetch == "one"
                        else None
                    )
                case Enqueue(request=request):
                    answer = outbox.enqueue(conn, request)
                case Check(requests=requests):
                    outbox.check(conn, requests)
                    answer = None
                case Cancel():
                    raise TypeError("cancel runs only on an async connection (erasure)")
    except StopIteration as stop:
        return stop.value


async def run_async(conn: AsyncConnection[Any], outbox: Outbox, steps: Steps) -> Any:
    """Drive ``steps`` on an async connection (the caller's transaction)."""
    answer: Any = None
    named = queries(outbox.schema)
    try:
        while True:
            step = steps.send(answer)
            match step:
                case Sql(name=name, params=params, fetch=fetch):
                    cursor = await conn.execute(named[name], params)
                    answer = (
                        await cursor.fetchall()
                        if fetch == "all"
                        else await cursor.fetchone()
                        if fetch == "one"
                        else None
                    )
                case Enqueue(request=request):
                    answer = await outbox.aenqueue(conn, request)
                case Check(requests=requests):
                    await outbox.acheck(conn, requests)
                    answer = None
                case Cancel(action_id=action_id, reason=reason):
                    answer = await outbox.acancel(conn, action_id, reason)
    except StopIteration as stop:
        return stop.value


def read_filing_steps(report_id: str) -> Steps:
    row = yield Sql("filing", {"report": report_id}, "one")
    return None if row is None else Filing.from_row(row)


def get_filing(
    conn: Connection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Filing | None:
    """The report's filing, or None when no report of this id was submitted."""
    from outbox_core import default_outbox

    return run_sync(conn, outbox or default_outbox(), read_filing_steps(report_id))  # type: ignore[no-any-return]


async def aget_filing(
    conn: AsyncConnection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Filing | None:
    """The async twin of :func:`get_filing`."""
    from outbox_core import default_outbox

    return await run_async(conn, outbox or default_outbox(), read_filing_steps(report_id))  # type: ignore[no-any-return]


# -- the drafting states, for outbox-draft ---------------------------------------------------


async def _move(conn: AsyncConnection[Any], schema: str, report_id: str, to: FilingState) -> bool:
    cursor = await conn.execute(
        queries(schema)["draft_state"],
        {"report": report_id, "state": str(to), "from": sources(to)},
    )
    return await cursor.fetchone() is not None


async def draft_claimed(conn: AsyncConnection[Any], schema: str, report_id: str) -> bool:
    """DRAFT_CLAIMED: a claim of the report's draft took it (call it in the attempt's
    transaction). False when the filing is in a state that does not allow it."""
    return await _move(conn, schema, report_id, FilingState.DRAFT_CLAIMED)


async def draft_deferred(conn: AsyncConnection[Any], schema: str, report_id: str) -> bool:
    """DRAFT_WAITING: the draft was deferred (``DRAFT_DEFERRED``, in ``rescheduled``)."""
    return await _move(conn, schema, report_id, FilingState.DRAFT_WAITING)


async def keep_answer(
    conn: AsyncConnection[Any],
    schema: str,
    report_id: str,
    generation: int,
    *,
    title: str,
    body: str,
) -> bool:
    """Keep the model's answer for ``generation`` on the filing (under the attempt's lease:
    ``attempt.transaction()``). False when the report moved on to another generation or was
    erased: the answer is dropped."""
    cursor = await conn.execute(
        queries(schema)["keep_answer"],
        {"report": report_id, "generation": generation, "title": title, "body": body},
    )
    return await cursor.fetchone() is not None


async def drop_answer(
    conn: AsyncConnection[Any], schema: str, report_id: str, generation: int
) -> bool:
    """Drop an answer kept for ``generation`` (the draft ended without DONE: the filing goes on
    with the report's own text). False when none was kept for it."""
    cursor = await conn.execute(
        queries(schema)["drop_answer"], {"report": report_id, "generation": generation}
    )
    return await cursor.fetchone() is not None


async def draft_ended(conn: AsyncConnection[Any], schema: str, report_id: str) -> bool:
    """ANSWERED: the draft ended, however (its ``ended`` hook). The filing uses the kept
    answer only when one was kept for its generation."""
    return await _move(conn, schema, report_id, FilingState.ANSWERED)
