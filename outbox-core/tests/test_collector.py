"""tune_collector(): what `outbox run` does to Python's garbage collector in its own process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from outbox_core.executor.collector import YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_collector")
def test_it_freezes_start_up_objects_and_raises_only_the_young_threshold() -> None:
    gc.set_threshold(700, 10, 10)
    tune_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("restored_collector")
def test_it_never_lowers_a_higher_threshold_nor_turns_a_disabled_collector_on() -> None:
    gc.set_threshold(50_000, 10, 10)
    tune_collector()
    assert gc.get_threshold() == (50_000, 10, 10)
    gc.set_threshold(0, 10, 10)
    tune_collector()
    assert gc.get_threshold() == (0, 10, 10)
