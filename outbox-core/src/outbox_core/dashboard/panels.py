"""What the dashboard shows, read in one transaction: never a payload."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection

from ..outbox import Outbox
from ..states import ActionState
from ..status import BlockedLane, OldestDue, StatusReport, collect_status

STATES = [str(state) for state in ActionState]
UNCERTAIN_LISTED = 50


@dataclass(frozen=True, slots=True)
class UncertainAction:
    id: int
    kind: str
    lane_key: str
    readback_ref: str | None
    stop_reason: str | None
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str
    stop_reason: str | None
    count: int
    last: datetime


@dataclass(frozen=True, slots=True)
class Minute:
    """Actions that ended in one minute of the last hour, by the state they ended in."""

    start: datetime
    ended: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.ended.values())


@dataclass(frozen=True, slots=True)
class KindInfo:
    kind: str
    plugin: str
    version: str
    at_most_once: bool
    instance_level: bool
    variants: str  # what the adapter decodes, as indented JSON
    json_path: str | None  # the path derived from it, as written (inside JSON it reads escaped)


def _kind_info(
    kind: str, plugin: str, version: str, at_most_once: bool, instance_level: bool, described: Any
) -> KindInfo:
    variants = dict(described)
    path = variants.pop("json_path", None)
    return KindInfo(
        kind,
        plugin,
        version,
        at_most_once,
        instance_level,
        json.dumps(variants, indent=2, ensure_ascii=False, default=str),
        None if path is None else str(path),
    )


@dataclass
class Panels:
    now: datetime
    by_state: dict[str, dict[str, int]] = field(default_factory=dict)
    status: StatusReport = field(default_factory=StatusReport)
    uncertain: list[UncertainAction] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    throughput: list[Minute] = field(default_factory=list)
    kinds: list[KindInfo] = field(default_factory=list)

    @property
    def blocked(self) -> list[BlockedLane]:
        return self.status.blocked

    @property
    def oldest_due(self) -> OldestDue | None:
        """The oldest due lane head, as ``outbox status`` and the gauges define due."""
        return self.status.oldest_due

    @property
    def lanes_blocked(self) -> int:
        """Lanes held by a head that waits for someone (a proposal, a newer build's row)."""
        return sum(kind.lanes_blocked - kind.lanes_scheduled for kind in self.status.kinds)

    @property
    def lanes_scheduled(self) -> int:
        """Lanes whose head is due later, with actions behind it."""
        return sum(kind.lanes_scheduled for kind in self.status.kinds)

    @property
    def totals(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for states in self.by_state.values():
            counts.update(states)
        return {state: counts.get(state, 0) for state in STATES}

    @property
    def busiest_minute(self) -> int:
        return max((minute.total for minute in self.throughput), default=0)


def read_panels(conn: Connection[Any], outbox: Outbox) -> Panels:
    """Every panel, from one REPEATABLE READ snapshot (the counts agree with each other)."""
    queries = outbox.queries
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        now: datetime = conn.execute("SELECT now()").fetchall()[0][0]
        panels = Panels(now=now)
        for kind, state, count in conn.execute(queries["dashboard_state_counts"]):
            panels.by_state.setdefault(kind, {s: 0 for s in STATES})[state] = count
        for kind in outbox.registry.kinds:
            panels.by_state.setdefault(kind, {s: 0 for s in STATES})
        panels.by_state = dict(sorted(panels.by_state.items()))
        panels.status = collect_status(conn, outbox)
        panels.uncertain = [
            UncertainAction(*row)
            for row in conn.execute(queries["dashboard_uncertain"], {"limit": UNCERTAIN_LISTED})
        ]
        panels.failures = [Failure(*row) for row in conn.execute(queries["dashboard_failures"])]
        panels.throughput = _minutes(now, conn.execute(queries["dashboard_throughput"]))
    finally:
        conn.execute("ROLLBACK")
    panels.kinds = _kinds(outbox)
    return panels


def _minutes(now: datetime, rows: Any) -> list[Minute]:
    """The last 60 minutes, the current one last, each with its endings (none: empty)."""
    counts: dict[datetime, dict[str, int]] = {}
    for minute, state, count in rows:
        counts.setdefault(minute, {})[state] = count
    current = now.replace(second=0, microsecond=0)
    starts = [current - timedelta(minutes=back) for back in range(59, -1, -1)]
    return [Minute(start, counts.get(start, {})) for start in starts]


def _kinds(outbox: Outbox) -> list[KindInfo]:
    """The installed plugins' kinds with their variants (``outbox plugins``, as a table)."""
    out = []
    for plugin in outbox.host.describe():
        for kind in plugin["kinds"]:
            out.append(
                _kind_info(
                    kind["kind"],
                    plugin["distribution"],
                    plugin["version"],
                    kind["at_most_once"],
                    kind["instance_level"],
                    kind["variants"],
                )
            )
    registered = {info.kind for info in out}
    for kind in outbox.registry.kinds:  # registered in code (a test's, an Outbox's own)
        if kind not in registered:
            entry = outbox.registry.get(kind)
            out.append(
                _kind_info(
                    kind,
                    entry.distribution,
                    "",
                    entry.adapter.at_most_once,
                    entry.adapter.instance_level,
                    entry.variants.describe(),
                )
            )
    return sorted(out, key=lambda info: info.kind)
