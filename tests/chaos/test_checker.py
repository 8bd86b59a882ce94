"""The checker can fail: a clean record passes, and a record with a duplicate, a gap, an overlap,
an order violation, an unended action, a dropped at-most-once answer taken for DONE, or a
traceback flips its verdict, each on the check that names it; so does a committed enqueue that the
table lacks."""

from __future__ import annotations

import dataclasses

import pytest

from .checker import ActionRow, Verdict, check
from .provider import DROPPED, OK, REFUSED, Write

ONCE = "CHAOS_ONCE"
READBACK = "CHAOS_READBACK"


def action(id: int, lane: str, kind: str = READBACK, state: str = "DONE") -> ActionRow:
    ended = None if state in ("ADMITTED", "EXECUTING") else 100.0 + id
    reason = {"DONE": "COMPLETED", "UNCERTAIN": "WRITE_UNCONFIRMED"}.get(state)
    return ActionRow(id, kind, lane, f"chaos-{id}", state, reason, 1, 0.0, ended)


def write(n: int, row: ActionRow, seq: int, outcome: str = OK, at: float | None = None) -> Write:
    start = at if at is not None else 100.0 + row.id - 0.5
    return Write(
        n, row.kind, row.key, row.lane, seq, row.id, 1, 1, outcome, start, start + 0.01, False
    )


def clean() -> tuple[list[Write], list[ActionRow]]:
    """Two lanes, three actions each (ids interleaved), both kinds, each written once."""
    rows = [
        action(1, "a"),
        action(2, "b", ONCE),
        action(3, "a", ONCE),
        action(4, "b"),
        action(5, "a"),
        action(6, "b", ONCE),
    ]
    seqs = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}
    return [write(i + 1, r, seqs[r.id]) for i, r in enumerate(rows)], rows


def verdict(
    writes: list[Write], rows: list[ActionRow], logs: dict[str, str] | None = None
) -> Verdict:
    return check(writes, rows, at_most_once=[ONCE], logs=logs)


def test_a_clean_record_passes() -> None:
    found = verdict(*clean(), logs={"executor-1.log": "INFO outbox executor.started\n"})
    assert found.ok, found.summary()
    assert found.figures["duplicates"] == 0
    assert found.figures["effects"] == 6


def test_a_refused_write_then_an_effect_passes() -> None:
    writes, rows = clean()
    refused = write(7, rows[0], 1, REFUSED, at=100.2)
    assert verdict([refused, *writes], rows).ok


@pytest.mark.parametrize("index", range(6))
def test_a_duplicate_fails_on_effects(index: int) -> None:
    writes, rows = clean()
    first = writes[index]
    again = dataclasses.replace(first, n=99, t_start=first.t_end + 0.1, t_end=first.t_end + 0.2)
    assert verdict([*writes, again], rows).failed() == ["effects"]


def test_a_gap_fails_on_effects() -> None:
    writes, rows = clean()
    del writes[2]  # action 3, the middle of lane a: DONE without an effect
    found = verdict(writes, rows)
    assert found.failed() == ["effects"]
    assert "action 3" in found.violations["effects"][0]


def test_an_overlap_fails_on_overlap() -> None:
    writes, rows = clean()
    first = writes[0]  # action 1 written twice at once: a refused write still running
    refused = dataclasses.replace(first, n=98, outcome=REFUSED, t_end=first.t_start + 0.005)
    refused = dataclasses.replace(refused, t_start=first.t_start - 0.001)
    assert verdict([refused, *writes], rows).failed() == ["overlap"]


def test_an_order_violation_fails_on_order() -> None:
    writes, rows = clean()
    # action 5 (lane a) written before action 3 of the same lane
    early = dataclasses.replace(writes[4], t_start=writes[2].t_start - 0.3)
    early = dataclasses.replace(early, t_end=early.t_start + 0.01)
    found = verdict([*writes[:4], early, writes[5]], rows)
    assert found.failed() == ["order"]


def test_a_write_before_the_lanes_earlier_action_ended_fails_on_order() -> None:
    writes, rows = clean()
    rows[0] = dataclasses.replace(rows[0], ended_at=writes[2].t_start + 0.001)
    assert verdict(writes, rows).failed() == ["order"]


def test_an_unended_action_fails_on_ended() -> None:
    writes, rows = clean()
    rows.append(action(7, "a", state="EXECUTING"))
    assert verdict(writes, rows).failed() == ["ended"]


def test_an_at_most_once_dropped_answer_taken_for_done_fails_on_effects() -> None:
    writes, rows = clean()
    writes[1] = dataclasses.replace(writes[1], outcome=DROPPED)  # action 2 is ONCE and DONE
    assert verdict(writes, rows).failed() == ["effects"]
    rows[1] = dataclasses.replace(rows[1], state="UNCERTAIN", stop_reason="WRITE_UNCONFIRMED")
    assert verdict(writes, rows).ok


def test_a_second_effect_of_an_uncertain_action_fails_on_effects() -> None:
    writes, rows = clean()
    rows[1] = dataclasses.replace(rows[1], state="UNCERTAIN", stop_reason="WRITE_UNCONFIRMED")
    first = writes[1]
    again = dataclasses.replace(first, n=97, t_start=first.t_end + 0.1, t_end=first.t_end + 0.2)
    assert verdict([*writes, again], rows).failed() == ["effects"]


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED"])
def test_an_effect_of_a_failed_or_cancelled_action_fails_on_effects(state: str) -> None:
    writes, rows = clean()
    rows[3] = dataclasses.replace(rows[3], state=state, stop_reason="REFUSED")
    assert verdict(writes, rows).failed() == ["effects"]


def test_a_write_naming_another_place_in_its_lane_fails_on_known() -> None:
    writes, rows = clean()
    writes[2] = dataclasses.replace(writes[2], seq=3)
    assert verdict(writes, rows).failed() == ["known"]


def test_a_traceback_in_a_log_fails_on_tracebacks() -> None:
    logs = {
        "executor-2.log": "ERROR outbox executor.task.failed\nTraceback (most recent call last):\n"
    }
    assert verdict(*clean(), logs=logs).failed() == ["tracebacks"]


def test_a_committed_enqueue_missing_from_the_table_fails_on_enqueued() -> None:
    writes, rows = clean()
    committed = [row.key for row in rows]
    assert check(writes, rows, at_most_once=[ONCE], committed=committed).ok
    lost = check(writes, rows, at_most_once=[ONCE], committed=[*committed, "chaos-7"])
    assert lost.failed() == ["enqueued"]
