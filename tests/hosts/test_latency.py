"""Executors on three hosts with 0, 2 and 20 ms added between them and their database (the
delay line of tests/hosts/relay.py: this kernel has no netem): every action starts and ends
through it, and the start latency and burn-down are reported (docs/reliability.md, "Executors
on several hosts", has the full-sized figures of ``python -m tests.hosts.latency``; nothing
here is timed against a bound)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from ..chaos.checker import check
from ..chaos.plugin import ONCE_KIND
from ..chaos.run import live_actions, read_actions
from .latency import PARAMS, measure
from .rig import rig

RUNS = [(0.0, "direct"), (0.0, "relay"), (2.0, "relay"), (20.0, "relay")]


def test_executors_on_three_hosts_run_every_action_at_0_2_and_20_ms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with rig(3, PARAMS, tmp_path) as r:
        found = [
            measure(r, hosts=3, delay_ms=delay, via=via, samples=8, burn=600, lanes=60)
            for delay, via in RUNS
        ]
        assert live_actions(r.url) == 0
        rows = read_actions(r.url)
        verdict = check(r.writes(), rows, at_most_once=[ONCE_KIND])
        assert verdict.ok, verdict.summary()
        assert len(rows) == len(RUNS) * (8 + 600)
        assert verdict.figures["duplicates"] == 0
    with capsys.disabled():
        print()
        for figures in found:
            print(f"hosts latency: {asdict(figures)}")
