"""How the passes over every live action read them: lane by lane, or the whole table once.

No index of ``agent_action`` separates the live actions from the ended ones (core migration 21:
an index on ``state`` would make every claim and ending write an entry into each index). The
counts that need every live action (the waiting and proposed actions, the blocked lanes, once a
minute; the retrying actions of ``outbox status``) read them one of two ways:

* lane by lane, from each lane row's ``head_id`` (every live action has its lane's row, at or
  after ``head_id``): a few index probes a lane, and none of the ended actions of the last
  days; measured at about 3 us a lane for the counts and 8 us for the blocked lanes;
* in one pass over the table: about 0.15 us a row, ended ones included.

:func:`by_table` picks the pass over the table when the lane table is large for the action
table's size, from the two relations' sizes on disk (exact and cheap to read, where the
planner's row estimates are as old as the last ANALYZE). At ``LANE_COST`` bytes of action table
for each byte of lane table, the two cost about the same: with a million actions, the lanes
win below about 20,000 lanes, the table above (``bench/maintenance.py`` measures both).

The blocked lanes cost a few probes a lane however long the lanes; the waiting and proposed
counts read every live action, each by a probe of its own, so lane by lane they also cost a
probe a live action, which a million pending in 10,000 lanes made a second of the server's
time. They read at most ``LANE_READ_BUDGET`` actions lane by lane, and the table once when that
was not all (:func:`counted`); the executor, which counts once a minute, reads the table at
once after a count that found the live actions over the budget (:func:`over_budget`), until a
count finds fewer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

# What reading one lane's live actions costs, in the bytes of action table that one pass reads
# in the same time, per byte of the lane's row: 8 us a lane of about 80 bytes against 0.15 us
# a row of about 200 bytes at fillfactor 50 (two rows' room each).
LANE_COST = 130


def by_table(lane_bytes: int, action_bytes: int) -> bool:
    """Whether a pass over every live action should read the whole action table once rather
    than lane by lane (``lane_bytes``, ``action_bytes``: the relations' sizes on disk)."""
    return lane_bytes * LANE_COST > action_bytes


# The most live actions the waiting and proposed counts read lane by lane (about 0.1 s of the
# server's time) before they read the table once instead.
LANE_READ_BUDGET = 100_000


def over_budget(rows: Sequence[Sequence[Any]], budget: int) -> bool:
    """Whether ``backlog_counts``' rows (kind, admitted, proposed, rows read) read ``budget``
    live actions or more: lane by lane, that it stopped there; from the table, that lane by lane
    it would have."""
    return sum(int(row[3]) for row in rows) >= budget


def counted(
    rows: Sequence[Sequence[Any]], scan: bool, budget: int = LANE_READ_BUDGET
) -> dict[str, tuple[int, int]] | None:
    """The admitted and proposed actions by kind from ``backlog_counts``' rows (kind, admitted,
    proposed, rows read), or None when its pass lane by lane (``scan`` false) stopped at its
    ``budget`` of rows: read the table then."""
    if not scan and over_budget(rows, budget):
        return None
    return {str(row[0]): (int(row[1]), int(row[2])) for row in rows if row[0] is not None}


Counts = dict[str, tuple[int, int]]


def count_live(
    run: Callable[[bool, int], Sequence[Sequence[Any]]], scan: bool
) -> tuple[Counts, bool]:
    """``backlog_counts`` as every reader runs it: ``run(scan, budget)`` returns its rows; lane
    by lane (``scan`` false) up to the budget, then the table once if that was not all. The
    counts, and whether they read the table."""
    while (counts := counted(run(scan, LANE_READ_BUDGET), scan, LANE_READ_BUDGET)) is None:
        scan = True
    return counts, scan


async def acount_live(
    run: Callable[[bool, int], Awaitable[Sequence[Sequence[Any]]]], scan: bool
) -> tuple[Counts, bool]:
    """:func:`count_live` for an async ``run``."""
    while (counts := counted(await run(scan, LANE_READ_BUDGET), scan, LANE_READ_BUDGET)) is None:
        scan = True
    return counts, scan
