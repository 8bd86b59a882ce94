"""A pytest plugin that checks the lane rule of the prototypes in bench/hot_layout.py: every
test database loses ux_agent_action_lane_executing and gets, in its place, the layout that
``HOT_LAYOUT_RULE`` names:

* ``side_table`` (the default; ``hot_side_table``): the side table and its triggers, the side
  table's key taking the index's name;
* ``lane_row`` (``hot_lane_row``): ``action_lane.exec_id``, its triggers and guards, and the
  claim reading the holder from the lane row;
* ``lane_row_lazy`` (``hot_lane_row_lazy``): the same column written at claims only;
* ``none``: nothing. All but the next-holder test fail: the tests are not passing by luck.

    PYTHONPATH=bench HOT_LAYOUT_RULE=lane_row python -m pytest \\
        outbox-core/tests/test_lane_rule.py -p hot_layout_rule

Every test there passes with either prototype (docs/benchmarks.md, "HOT claims and endings").
"""

from __future__ import annotations

import os

import psycopg
import pytest
from hot_layout import (
    HOLDER_LANE_ROW,
    HOLDER_LANE_ROW_LAZY,
    LANE_ROW,
    LANE_ROW_LAZY,
    SIDE_TABLE,
    replace_holder,
)

from outbox_core.testing import OutboxTestDatabase

LANE_ROWS = {
    "lane_row": (LANE_ROW, HOLDER_LANE_ROW),
    "lane_row_lazy": (LANE_ROW_LAZY, HOLDER_LANE_ROW_LAZY),
}


@pytest.fixture(autouse=True)
def _lane_rule_of_the_prototype(db: OutboxTestDatabase) -> None:
    schema = f'"{db.schema}".'
    rule = os.environ.get("HOT_LAYOUT_RULE", "side_table")
    db.execute(f"DROP INDEX {schema}ux_agent_action_lane_executing")
    if rule == "side_table":
        for statement in SIDE_TABLE:
            db.execute(
                statement.replace("outbox.", schema).replace(
                    "lane_key text PRIMARY KEY",
                    "lane_key text CONSTRAINT ux_agent_action_lane_executing PRIMARY KEY",
                )
            )
    elif rule in LANE_ROWS:
        statements, holder = LANE_ROWS[rule]
        for statement in statements:
            db.execute(statement.replace("outbox.", schema))
        with psycopg.connect(db.url, autocommit=True) as conn:
            replace_holder(conn, db.schema, holder, lane_row=True)
    elif rule != "none":
        raise ValueError(f"HOT_LAYOUT_RULE={rule!r}: side_table, {', '.join(LANE_ROWS)} or none")
