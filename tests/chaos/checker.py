"""What must hold after a chaos run, read from the provider's record and the action table.

:func:`check` is a pure function of the two (and of the executors' logs), so that its tests can
feed it records with a duplicate, a gap, an overlap or an order violation and see it fail
(``test_checker.py``). Each rule is a named check; a verdict is ``ok`` when no check found a
violation.

========================  ==========================================================================
check                     rule
========================  ==========================================================================
``ended``                 every action ended (DONE, UNCERTAIN, FAILED or CANCELLED)
``known``                 every write names an action of the table, of its kind and lane, with the
                          action's place in its lane as ``seq``
``effects``               read-back kind: exactly one effect per DONE, none per FAILED or CANCELLED,
                          at most one per UNCERTAIN. At-most-once kind: at most one effect, none per
                          FAILED or CANCELLED, one per DONE, and an effect whose answer was dropped
                          only on an UNCERTAIN action
``order``                 per lane, writes in id order, and none before the lane's earlier action
                          ended
``overlap``               per lane, no write received before the lane's previous write finished
``tracebacks``            no ``Traceback`` in an executor's log
``enqueued``              every enqueue whose commit the producer saw return is in the table (when
                          the run says which committed: a failover may lose a commit)
========================  ==========================================================================
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .provider import DROPPED, Write

ENDED = frozenset({"DONE", "UNCERTAIN", "FAILED", "CANCELLED"})
CHECKS = ("ended", "known", "effects", "order", "overlap", "tracebacks", "enqueued")
EXAMPLES = 5  # violations quoted per check; all are counted


@dataclass(frozen=True)
class ActionRow:
    """The columns of ``agent_action`` the checker reads (times as Unix seconds)."""

    id: int
    kind: str
    lane: str
    key: str
    state: str
    stop_reason: str | None
    epoch: int
    created_at: float
    ended_at: float | None
    attempt: int = 1


@dataclass
class Verdict:
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def failed(self) -> list[str]:
        return [name for name, found in self.violations.items() if found]

    def add(self, check: str, message: str) -> None:
        self.violations[check].append(message)

    def summary(self) -> str:
        lines = [f"verdict: {'ok' if self.ok else 'FAILED: ' + ', '.join(self.failed())}"]
        for name, found in self.violations.items():
            if found:
                lines.append(f"  {name}: {len(found)}")
                lines += [f"    {message}" for message in found[:EXAMPLES]]
        return "\n".join(lines)


def check(
    writes: Iterable[Write],
    actions: Iterable[ActionRow],
    *,
    at_most_once: Iterable[str],
    logs: Mapping[str, str] | None = None,
    committed: Iterable[str] | None = None,
) -> Verdict:
    """The verdict on one run: ``writes`` as the provider recorded them, ``actions`` as the table
    holds them after the run, ``at_most_once`` the kinds that never write twice, ``logs`` each
    executor's log by name, ``committed`` the idempotency keys whose enqueue the producer saw
    commit."""
    verdict = Verdict()
    once = frozenset(at_most_once)
    rows = {a.id: a for a in actions}
    received = sorted(writes, key=lambda w: (w.t_start, w.n))
    lanes: dict[str, list[ActionRow]] = defaultdict(list)
    for row in sorted(rows.values(), key=lambda a: a.id):
        lanes[row.lane].append(row)
    place = {a.id: i + 1 for lane in lanes.values() for i, a in enumerate(lane)}

    for row in rows.values():
        if row.state not in ENDED:
            verdict.add("ended", f"action {row.id} ({row.kind}) is {row.state}")

    by_action: dict[int, list[Write]] = defaultdict(list)
    for w in received:
        named = rows.get(w.action_id)
        if named is None or (named.kind, named.lane, named.key) != (w.kind, w.lane, w.key):
            verdict.add("known", f"write {w.n} names no action of the table: {w.action_id}")
            continue
        if w.seq != place[named.id]:
            verdict.add(
                "known", f"write {w.n}: seq {w.seq}, action {named.id} is {place[named.id]}"
            )
        by_action[named.id].append(w)

    _check_effects(verdict, rows.values(), by_action, once)
    _check_lanes(verdict, received, rows)
    for name, text in sorted((logs or {}).items()):
        if "Traceback" in text:
            verdict.add("tracebacks", f"{name}: {text.count('Traceback')} traceback(s)")
    keys = {a.key for a in rows.values()}
    for key in sorted(set(committed or ()) - keys):
        verdict.add("enqueued", f"the enqueue of {key} committed, and the table has no {key}")

    verdict.figures = _figures(received, rows.values(), by_action, lanes)
    return verdict


def _check_effects(
    verdict: Verdict,
    rows: Iterable[ActionRow],
    by_action: Mapping[int, Sequence[Write]],
    once: frozenset[str],
) -> None:
    for row in rows:
        effects = [w for w in by_action.get(row.id, ()) if w.effect]
        count = len(effects)
        what = f"action {row.id} ({row.kind}, {row.state} {row.stop_reason}): {count} effect(s)"
        wrong = (
            (row.state == "DONE" and count != 1)
            or (row.state in ("FAILED", "CANCELLED") and count > 0)
            or (row.state == "UNCERTAIN" and count > 1)
            or (row.kind in once and count > 1)
        )
        if wrong:
            verdict.add("effects", what)
        dropped = any(w.outcome == DROPPED for w in effects)
        if row.kind in once and row.state != "UNCERTAIN" and dropped:
            verdict.add("effects", f"{what}, its answer dropped, yet not UNCERTAIN")


def _check_lanes(
    verdict: Verdict, received: Sequence[Write], rows: Mapping[int, ActionRow]
) -> None:
    by_lane: dict[str, list[Write]] = defaultdict(list)
    for w in received:
        if w.action_id in rows:
            by_lane[w.lane].append(w)
    earlier: dict[str, list[ActionRow]] = defaultdict(list)
    for row in sorted(rows.values(), key=lambda a: a.id):
        earlier[row.lane].append(row)
    for lane, lane_writes in by_lane.items():
        previous: Write | None = None
        for w in lane_writes:
            if previous is not None:
                if w.action_id < previous.action_id:
                    verdict.add(
                        "order",
                        f"lane {lane}: action {w.action_id} written after {previous.action_id}",
                    )
                if w.t_start < previous.t_end:
                    verdict.add(
                        "overlap",
                        f"lane {lane}: write {w.n} (action {w.action_id}) began "
                        f"{previous.t_end - w.t_start:.3f} s before write {previous.n} "
                        f"(action {previous.action_id}) finished",
                    )
            previous = w
        for before, row in zip(earlier[lane], earlier[lane][1:], strict=False):
            first = next((w for w in lane_writes if w.action_id == row.id), None)
            if first is None:
                continue
            if before.ended_at is None or first.t_start < before.ended_at:
                verdict.add(
                    "order",
                    f"lane {lane}: action {row.id} written before action {before.id} ended",
                )


def _figures(
    received: Sequence[Write],
    rows: Iterable[ActionRow],
    by_action: Mapping[int, Sequence[Write]],
    lanes: Mapping[str, Sequence[ActionRow]],
) -> dict[str, Any]:
    rows = list(rows)
    epochs = {r.id: r.epoch for r in rows}
    endings = Counter((r.kind, r.state, r.stop_reason or "") for r in rows)
    outcomes = Counter((w.kind, w.outcome) for w in received)
    effects = {a: sum(1 for w in ws if w.effect) for a, ws in by_action.items()}
    waits: list[tuple[float, int]] = []
    first_claim_waits: list[tuple[float, int]] = []
    for lane in lanes.values():
        for i, row in enumerate(lane):
            writes = by_action.get(row.id)
            if not writes:
                continue
            previous_end = lane[i - 1].ended_at if i else None
            due = max(row.created_at, previous_end or row.created_at)
            wait = (writes[0].t_start - due, row.id)
            waits.append(wait)
            if writes[0].epoch == 1:
                first_claim_waits.append(wait)
    return {
        "actions": len(rows),
        "lanes": len(lanes),
        "endings": {" ".join(k).strip(): v for k, v in sorted(endings.items())},
        "writes": {" ".join(k): v for k, v in sorted(outcomes.items())},
        "effects": sum(effects.values()),
        "duplicates": sum(1 for n in effects.values() if n > 1),
        "late_writes": sum(1 for w in received if w.late),
        # Writes whose holder then lost the action to a later claim (killed, or its answer
        # lost): the after-the-fence case that a pause would turn into a late write.
        "written_then_reclaimed": sum(
            1
            for w in received
            if w.effect and w.action_id in epochs and w.epoch < epochs[w.action_id]
        ),
        "worst_wait_seconds": round(max(waits)[0], 3) if waits else None,
        "worst_wait_action": max(waits)[1] if waits else None,
        "worst_first_claim_wait_seconds": (
            round(max(first_claim_waits)[0], 3) if first_claim_waits else None
        ),
        "worst_first_claim_wait_action": max(first_claim_waits)[1] if first_claim_waits else None,
    }
