"""What ``outbox status`` shows: the backlog per kind, the lanes that are blocked, the actions
that wait to run again and those that failed lately (with their last attempt's detail), and the
kinds that an executor with these settings would stop (see ``startup.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from psycopg import Connection

from . import live_reads
from .outbox import Outbox
from .startup import StoppedKind, check_kinds


@dataclass(frozen=True, slots=True)
class KindStatus:
    kind: str
    due: int = 0
    waiting: int = 0
    executing: int = 0
    oldest_due_age_seconds: float = 0.0
    uncertain: int = 0
    lanes_blocked: int = 0  # every lane held by its head (as the gauge counts them) ...
    proposed: int = 0
    lanes_scheduled: int = 0  # ... of which those whose head is only due later


@dataclass(frozen=True, slots=True)
class BlockedLane:
    lane_key: str
    head_id: int
    head_kind: str
    head_state: str
    head_due: datetime | None  # None for a proposal: no due time until it is admitted
    foreign_head: bool
    since: datetime

    @property
    def scheduled(self) -> bool:
        """The head is due later (a not_before, a backoff, a deferral) and will run then: the
        lane is scheduled, not blocked (a proposal or a head from a newer build waits for
        someone else)."""
        return not self.foreign_head and self.head_due is not None

    @property
    def why(self) -> str:
        if self.foreign_head:
            return "head from a newer build"
        if self.head_due is None:
            return "head is a proposal, not yet admitted or refused"
        return f"head waits until {self.head_due:%Y-%m-%d %H:%M:%S}"


@dataclass(frozen=True, slots=True)
class OldestDue:
    """The lane head that has been due the longest, of every kind (``backlog_due``)."""

    id: int
    kind: str
    lane_key: str
    waited_seconds: float


@dataclass(frozen=True, slots=True)
class LastAttempt:
    """An action whose last attempt did not end it well, and why (its adapter's detail)."""

    id: int
    kind: str
    lane_key: str
    state: str
    attempt: int
    max_attempts: int
    last_result: str | None
    detail: str | None
    at: datetime | None  # retrying: when it runs again; failed: when it ended
    stop_reason: str | None = None


@dataclass(frozen=True)
class StatusReport:
    kinds: list[KindStatus] = field(default_factory=list)
    blocked: list[BlockedLane] = field(default_factory=list)
    stopped: list[StoppedKind] = field(default_factory=list)
    retrying: list[LastAttempt] = field(default_factory=list)
    failed: list[LastAttempt] = field(default_factory=list)
    oldest_due: OldestDue | None = None

    def as_dict(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime) else value

        return {
            "kinds": [asdict(kind) for kind in self.kinds],
            "blocked_lanes": [
                {key: plain(value) for key, value in asdict(lane).items()} for lane in self.blocked
            ],
            "stopped_kinds": [asdict(kind) for kind in self.stopped],
            "retrying": [
                {key: plain(value) for key, value in asdict(row).items()} for row in self.retrying
            ],
            "recent_failures": [
                {key: plain(value) for key, value in asdict(row).items()} for row in self.failed
            ],
            "oldest_due": None if self.oldest_due is None else asdict(self.oldest_due),
        }


def collect_status(conn: Connection[Any], outbox: Outbox, *, lanes: int = 20) -> StatusReport:
    """Counts of the rows this build decodes, by kind (as the executor's gauges count them,
    docs/metrics.md, but every due lane read); blocked lanes, oldest first; up to ``lanes``
    actions waiting to run again after an attempt that did not end them, and as many that
    ended FAILED or UNCERTAIN in the last day, each with its last attempt's detail; the kinds
    whose adapter cannot be built with ``outbox.settings`` (an executor would stop them)."""
    registry = outbox.registry
    flt = registry.filter()
    params: dict[str, Any] = flt.params()
    stats: dict[str, dict[str, Any]] = {kind: {} for kind in registry.kinds}
    due_admitted: dict[str, int] = {}
    queries = outbox.queries
    oldest: tuple[float, int, str] | None = None
    for kind, due, admitted, age, age_id in conn.execute(
        queries["backlog_due"], {**params, "limit": None}
    ):
        stats.setdefault(kind, {}).update(due=due, oldest_due_age_seconds=round(age, 3))
        due_admitted[kind] = admitted
        if oldest is None or age > oldest[0]:
            oldest = (age, age_id, kind)
    oldest_due = None
    if oldest is not None:
        row = conn.execute(queries["action_by_id"], {"id": oldest[1]}).fetchone()
        lane = row[3] if row is not None else "(ended since)"
        oldest_due = OldestDue(oldest[1], oldest[2], lane, round(oldest[0], 3))
    for kind, executing in conn.execute(queries["backlog_executing"], params):
        stats.setdefault(kind, {})["executing"] = executing
    sizes = conn.execute(queries["live_read_sizes"]).fetchone()
    scan = sizes is not None and live_reads.by_table(*sizes)
    # The blocked lanes by the tables' sizes; the counts, which read every live action (and so
    # the retrying ones), also by how many there are.
    params = {**params, "scan": scan}
    live, count_scan = live_reads.count_live(
        lambda by_table, budget: conn.execute(
            queries["backlog_counts"], {**params, "scan": by_table, "budget": budget}
        ).fetchall(),
        scan,
    )
    for kind, (admitted, proposed) in live.items():
        # The waiting actions are the admitted ones less the due heads; read by a later
        # statement (the caller's connection, not one snapshot), so a head claimed in between
        # must not make the difference negative.
        waiting = max(admitted - due_admitted.get(kind, 0), 0)
        stats.setdefault(kind, {}).update(waiting=waiting, proposed=proposed)
    for kind, count in conn.execute(outbox.queries["uncertain_counts"], {"kinds": flt.kinds}):
        stats.setdefault(kind, {})["uncertain"] = count
    blocked: list[BlockedLane] = []
    counts: dict[str, int] = {}
    scheduled: dict[str, int] = {}
    rows = conn.execute(outbox.queries["blocked_lanes"], {**params, "limit": 100_000}).fetchall()
    for kind, lane_key, head_id, head_state, head_due, since, foreign in rows:
        lane = BlockedLane(lane_key, head_id, kind, head_state, head_due, foreign, since)
        counts[kind] = counts.get(kind, 0) + 1
        scheduled[kind] = scheduled.get(kind, 0) + lane.scheduled
        if len(blocked) < lanes:
            blocked.append(lane)
    for kind, count in counts.items():
        stats.setdefault(kind, {}).update(lanes_blocked=count, lanes_scheduled=scheduled[kind])
    retrying = [
        LastAttempt(*row)
        for row in conn.execute(queries["retrying_actions"], {"limit": lanes, "scan": count_scan})
    ]
    failed = [
        LastAttempt(*row) for row in conn.execute(queries["recent_failures"], {"limit": lanes})
    ]
    return StatusReport(
        kinds=[KindStatus(kind, **values) for kind, values in sorted(stats.items())],
        blocked=blocked,
        stopped=check_kinds(registry, outbox.settings),
        retrying=retrying,
        failed=failed,
        oldest_due=oldest_due,
    )


def print_status(report: StatusReport) -> None:
    """The report as tables on the terminal (`outbox status`, the quickstart)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title="outbox status")
    # A kind's name is never cut short: the other columns' headers wrap first.
    widest = max((len(kind.kind) for kind in report.kinds), default=4)
    table.add_column("kind", justify="left", min_width=widest, no_wrap=True)
    for column in (
        "due",
        "waiting",
        "executing",
        "oldest due",
        "uncertain",
        "proposed",
        "lanes blocked",
    ):
        table.add_column(column, justify="right")
    for kind in report.kinds:
        table.add_row(
            kind.kind,
            str(kind.due),
            str(kind.waiting),
            str(kind.executing),
            f"{kind.oldest_due_age_seconds:.1f} s",
            str(kind.uncertain),
            str(kind.proposed),
            str(kind.lanes_blocked),
        )
    console.print(table)
    if report.blocked:
        lanes = Table(title="blocked lanes (oldest first)")
        for column in ("lane", "head", "head kind", "why", "since"):
            lanes.add_column(column)
        for lane in report.blocked:
            lanes.add_row(
                Text(lane.lane_key),  # the application's string, not markup
                str(lane.head_id),
                Text(lane.head_kind),
                lane.why,
                f"{lane.since:%Y-%m-%d %H:%M:%S}",
            )
        console.print(lanes)
    for rows, title, when in (
        (report.retrying, "waiting to run again (soonest first)", "next"),
        (report.failed, "failed or uncertain in the last day (newest first)", "ended"),
    ):
        if not rows:
            continue
        attempts = Table(title=title)
        for column in ("action", "kind", "state", "attempt", "last result", "detail", when):
            attempts.add_column(column)
        for row in rows:
            result = row.last_result or ""
            if row.stop_reason:
                result = f"{result} ({row.stop_reason})" if result else row.stop_reason
            attempts.add_row(
                str(row.id),
                row.kind,
                row.state,
                f"{row.attempt}/{row.max_attempts}",
                result,
                Text(row.detail or ""),  # the adapter's text, not markup
                f"{row.at:%Y-%m-%d %H:%M:%S}" if row.at is not None else "",
            )
        console.print(attempts)
    if report.stopped:
        stopped = Table(title="kinds stopped: their adapter cannot be built with these settings")
        for column in ("kind", "from", "why"):
            stopped.add_column(column)
        for halted in report.stopped:
            stopped.add_row(halted.kind, halted.distribution, Text(halted.error))
        console.print(stopped)
