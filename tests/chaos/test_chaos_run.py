"""The CI-sized chaos run (``run.CI_SIZE``), inside the default ``nox``: the verdict of the
checker must be ok, and the run must have met the faults it is about (kills, both restarts,
refused and dropped writes)."""

from __future__ import annotations

import os

import pytest

from .run import CI_SIZE, parse_params, run_chaos

pytestmark = pytest.mark.skipif(
    os.environ.get("CHAOS_SKIP") == "1", reason="CHAOS_SKIP=1: the chaos run is skipped"
)


def test_a_ci_sized_chaos_run_keeps_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    params = parse_params([], CI_SIZE)  # CHAOS_<NAME> variables may change it
    report = run_chaos(params)
    with capsys.disabled():
        print(report.text())
    assert report.verdict.ok, f"{report.verdict.summary()}\nlogs: {report.logs}"
    assert report.kills >= 3
    assert [r["mode"] for r in report.restarts] == params.restart_modes
    assert all(r["first_ending_after_seconds"] is not None for r in report.restarts)
    writes = report.verdict.figures["writes"]
    assert any(name.endswith("refused") for name in writes)
    assert any(name.endswith("dropped") for name in writes)
