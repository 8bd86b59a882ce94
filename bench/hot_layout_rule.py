"""A pytest plugin that checks the lane rule of the side-table prototype (bench/hot_layout.py,
``hot_side_table``): every test database loses ux_agent_action_lane_executing and gets the
side table and its triggers instead, the side table's key taking the index's name.

    PYTHONPATH=bench python -m pytest outbox-core/tests/test_lane_rule.py -p hot_layout_rule

Every test there passes with the prototype (docs/benchmarks.md, "HOT claims and endings"); with
``HOT_LAYOUT_RULE=none`` the index is dropped and nothing replaces it, and all but the
next-holder test fail: the tests are not passing by luck.
"""

from __future__ import annotations

import os

import pytest
from hot_layout import SIDE_TABLE

from outbox_core.testing import OutboxTestDatabase


@pytest.fixture(autouse=True)
def _lane_rule_of_the_prototype(db: OutboxTestDatabase) -> None:
    schema = f'"{db.schema}".'
    db.execute(f"DROP INDEX {schema}ux_agent_action_lane_executing")
    if os.environ.get("HOT_LAYOUT_RULE") != "none":
        for statement in SIDE_TABLE:
            db.execute(
                statement.replace("outbox.", schema).replace(
                    "lane_key text PRIMARY KEY",
                    "lane_key text CONSTRAINT ux_agent_action_lane_executing PRIMARY KEY",
                )
            )
