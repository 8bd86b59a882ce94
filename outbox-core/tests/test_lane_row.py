"""The lane row's bounds hold while a lane's heads are claimed one after another by settle.

A chained claim may leave the lane row alone (migration 0006); what the row says must stay a
bound that every claim can rely on: head_id at or below the lane's first live action, next_at
no later than the executing head's lease, head_kind the head's kind.
"""

from __future__ import annotations

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

LANE = "lane-chained"


def test_a_lane_chained_forty_times_keeps_its_row_a_bound_and_runs_in_id_order(
    db: OutboxTestDatabase,
) -> None:
    with db.connect(autocommit=True) as conn:
        ids = [
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", LANE, f"chain-{n}")).id
            for n in range(40)
        ]
    schema = f'"{db.schema}"'
    claimed = db.rows(
        f"SELECT id, epoch FROM {schema}.claim_v1(10, interval '5 minutes', ARRAY['TEST_NOOP'], "
        "ARRAY[NULL]::jsonpath[], ARRAY[NULL]::text[]) WHERE op = 'claim'"
    )
    ran = [claimed[0][0]]
    row_versions = set()
    for _ in range(39):
        head, epoch = claimed[0]
        claimed = db.rows(
            f"SELECT id, epoch FROM {schema}.settle_v1(ARRAY[%s::bigint], ARRAY[%s::bigint], "
            "ARRAY['EXECUTING'], ARRAY['DONE'], ARRAY['COMPLETED'], ARRAY[NULL], ARRAY[0.0], "
            "ARRAY['keep'], ARRAY[NULL]::timestamptz[], ARRAY[0], ARRAY['Done'], true, "
            "interval '5 minutes', ARRAY['TEST_NOOP'], ARRAY[NULL]::jsonpath[], "
            "ARRAY[NULL]::text[]) WHERE op = 'claim'",
            (head, epoch),
        )
        assert len(claimed) == 1, "settle chains the lane's next head"
        ran.append(claimed[0][0])
        bounds = db.rows(
            f"SELECT l.head_id <= min(a.id), l.next_at <= max(a.lease_until), l.head_kind, "
            f"l.xmin::text FROM {schema}.action_lane l JOIN {schema}.agent_action a "
            "USING (lane_key) WHERE l.lane_key = %s AND a.state IN ('ADMITTED', 'EXECUTING') "
            "GROUP BY l.head_id, l.next_at, l.head_kind, l.xmin",
            (LANE,),
        )
        assert bounds[0][:3] == (True, True, "TEST_NOOP")
        row_versions.add(bounds[0][3])
    assert ran == ids
    # The row was left alone by most of the 39 chained claims (one in eight moves it).
    assert len(row_versions) < 39
