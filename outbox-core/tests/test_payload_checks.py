"""The checks of a payload's JSON before it is sent: the batch-wide ``clean_json_many`` decides
as the one-by-one ``clean_json`` does, never passes what ``json_problem`` refuses, and
``json_problem`` names a payload that holds itself instead of walking it forever."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox_core import ActionRequest, InvalidRequest
from outbox_core.requests import clean_json, clean_json_many, json_problem
from outbox_core.testing import OutboxTestDatabase

from .test_enqueue_fuzz import JSON, PAYLOAD


class Sub(str):
    """A str subclass: not one of the exact types either check clears (the walk decides)."""


# Beside the JSON values: what a payload may hold that is not one.
ODD = st.one_of(
    JSON,
    st.sampled_from([{1: "int key"}, {None: 1}, {"set": {1}}, {"bytes": b"x"}, (1, "t")]),
    st.builds(lambda text: {"sub": Sub(text)}, st.text(max_size=3)),
    st.builds(lambda text: {Sub(text): 1}, st.text(max_size=3)),
)


@given(st.lists(st.one_of(PAYLOAD, ODD), max_size=6))
@settings(max_examples=400, deadline=None)
def test_the_batch_check_decides_as_the_one_by_one_check(values: list[Any]) -> None:
    together = clean_json_many(values)
    assert together == all(clean_json(value) for value in values), values
    if together:
        assert all(json_problem(value) is None for value in values), values


def test_the_batch_check_sends_each_kind_of_misfit_to_the_walk() -> None:
    fine = {"a": [1, 2.5, "é", None, True, {"b": ("t", -3)}], "😀": {}}
    assert clean_json_many([fine, {}, {"n": 10**3000}])
    for misfit in (
        {1: "key"},
        {"a\x00": 1},
        {"\ud800": 1},
        {"a": "x\x00"},
        {"a": ["\udfff"]},
        {"a": float("nan")},
        {"a": float("-inf")},
        {"a": 1e16},
        {"a": [{"b": -2e20}]},
        {"a": 10**4000},
        {"a": {1, 2}},
        {"a": b"bytes"},
    ):
        assert not clean_json_many([fine, misfit]), misfit
        assert json_problem(misfit) is not None, misfit


def test_a_payload_that_holds_itself_is_named_not_walked_forever() -> None:
    looped: dict[str, Any] = {"a": 1}
    looped["self"] = looped
    assert json_problem(looped) == (
        "payload.self",
        "holds itself (a cycle), which JSON cannot write",
    )
    inner: list[Any] = []
    inner.append({"up": inner})
    assert json_problem({"x": [0, inner]}) == (
        "payload.x[1][0].up",
        "holds itself (a cycle), which JSON cannot write",
    )
    assert not clean_json_many([looped])
    # Shared, not looped: the same object twice beside itself is fine.
    shared = {"k": [1]}
    assert json_problem({"a": shared, "b": [shared, shared]}) is None


@pytest.mark.parametrize("many", [False, True])
def test_enqueue_refuses_a_payload_that_holds_itself_and_writes_nothing(
    db: OutboxTestDatabase, many: bool
) -> None:
    looped: dict[str, Any] = {"n": 1}
    looped["self"] = looped
    bad = ActionRequest("TEST_NOOP", "lane", "looped", payload=looped)
    good = ActionRequest("TEST_NOOP", "lane", "good", payload={"n": 2})
    with db.connect() as conn:
        enqueue = (
            (lambda: db.outbox.enqueue_many(conn, [good, bad]))
            if many
            else (lambda: db.outbox.enqueue(conn, bad))
        )
        with pytest.raises(InvalidRequest) as refused:
            enqueue()
        assert str(refused.value) == "payload.self: holds itself (a cycle), which JSON cannot write"
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM outbox.agent_action").fetchone() == (0,)
