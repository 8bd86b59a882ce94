"""What ``outbox status`` shows: the backlog per kind and the lanes that are blocked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from psycopg import Connection

from .outbox import Outbox


@dataclass(frozen=True, slots=True)
class KindStatus:
    kind: str
    due: int = 0
    executing: int = 0
    oldest_due_age_seconds: float = 0.0
    uncertain: int = 0
    lanes_blocked: int = 0
    proposed: int = 0


@dataclass(frozen=True, slots=True)
class BlockedLane:
    lane_key: str
    head_id: int
    head_kind: str
    head_state: str
    head_due: datetime | None  # None for a proposal: no due time until it is admitted
    foreign_head: bool
    since: datetime


@dataclass(frozen=True)
class StatusReport:
    kinds: list[KindStatus] = field(default_factory=list)
    blocked: list[BlockedLane] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime) else value

        return {
            "kinds": [asdict(kind) for kind in self.kinds],
            "blocked_lanes": [
                {key: plain(value) for key, value in asdict(lane).items()} for lane in self.blocked
            ],
        }


def collect_status(conn: Connection[Any], outbox: Outbox, *, lanes: int = 20) -> StatusReport:
    """Counts of the rows this build decodes, by kind; blocked lanes, oldest first."""
    registry = outbox.registry
    flt = registry.filter()
    params = {"kinds": flt.kinds, "paths": flt.paths, "suffixes": flt.suffixes}
    stats: dict[str, dict[str, Any]] = {kind: {} for kind in registry.kinds}
    for kind, due, executing, oldest, proposed in conn.execute(outbox.queries["backlog"], params):
        stats.setdefault(kind, {}).update(
            due=due,
            executing=executing,
            oldest_due_age_seconds=round(oldest, 3),
            proposed=proposed,
        )
    for kind, count in conn.execute(outbox.queries["uncertain_counts"], {"kinds": flt.kinds}):
        stats.setdefault(kind, {})["uncertain"] = count
    blocked: list[BlockedLane] = []
    counts: dict[str, int] = {}
    rows = conn.execute(outbox.queries["blocked_lanes"], {**params, "limit": 100_000}).fetchall()
    for kind, lane_key, head_id, head_state, head_due, since, foreign in rows:
        counts[kind] = counts.get(kind, 0) + 1
        if len(blocked) < lanes:
            blocked.append(
                BlockedLane(lane_key, head_id, kind, head_state, head_due, foreign, since)
            )
    for kind, count in counts.items():
        stats.setdefault(kind, {})["lanes_blocked"] = count
    return StatusReport(
        kinds=[KindStatus(kind, **values) for kind, values in sorted(stats.items())],
        blocked=blocked,
    )
