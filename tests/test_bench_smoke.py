"""The benchmark harness does not rot: outbox's own workloads at tiny sizes, and the report
(table, ratios, plot) from a run that includes peers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import run_all  # noqa: E402


@pytest.mark.slow
def test_the_quick_run_of_outbox_workloads_writes_the_table_and_the_plot(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "run_all.py"),
            "--quick",
            "--no-peers",
            "--docs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    figures = json.loads(completed.stdout)["figures"]
    for workload in (
        "burn",
        "burn_c1000_pool4",
        "burn_fenced",
        "burn_pending",
        "burn_two_processes",
        "burn_hot_lane",
        "enqueue_single",
        "enqueue_bulk",
        "latency",
        "producers_1",
        "producers_64",
    ):
        assert figures[f"{workload} / outbox"] > 0, workload
    for workload, system in (
        ("enqueue_single", run_all.RAW),
        ("enqueue_bulk", run_all.RAW),
        ("enqueue_bulk", run_all.RAW_JSON),
        ("producers_16", run_all.RAW),
        ("producers_16", run_all.RAW_NOTIFY),
    ):
        assert figures[f"{workload} / {system}"] > 0, (workload, system)
    page = (tmp_path / "benchmarks.md").read_text()
    assert run_all.START in page and "| burn |" in page
    assert (tmp_path / "benchmarks.png").stat().st_size > 10_000


def test_ratios_are_taken_run_by_run_and_peers_without_a_feature_are_marked(tmp_path: Path) -> None:
    table = run_all.Table(
        runs={
            ("burn", "outbox"): [100.0, 300.0],
            ("burn", "pgqueuer (asyncpg)"): [50.0, 300.0],
            ("latency", "outbox"): [2.0, 4.0],
            ("latency", "pgqueuer (asyncpg)"): [4.0, 4.0],
        },
        notes={("burn", "pgqueuer (asyncpg)"): run_all.NO_LANES},
    )
    info = {"cores": 2, "python": "3.11", "postgresql": "15", "settings": {"fsync": "on"}}
    text = run_all.markdown(table, info, 2, quick=True)
    # Per-run ratios 2.0 and 1.0: their median 1.5, not the ratio of the medians (200/175).
    assert "| burn | 1.50× |" in text
    assert "| latency | 1.50× |" in text  # latency inverted: 4/2 and 4/4
    assert run_all.NO_LANES in text
    run_all.plot(table, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5_000


def test_the_gauge_bench_times_every_gauge_statement_of_both_builds() -> None:
    queries = REPO / "outbox-core" / "src" / "outbox_core" / "sql" / "queries.sql"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gauges.py"),
            "--shape",
            "behind_backoff",
            "--count",
            "20000",
            "--runs",
            "1",
            "--queries",
            str(queries),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO / "bench",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = [json.loads(line) for line in completed.stdout.splitlines()]
    timed = {(row["build"], row["statement"]) for row in rows}
    for build in ("this", "before"):
        assert {
            (build, "backlog_due"),
            (build, "backlog_counts"),
            (build, "blocked_lanes"),
        } <= timed
    assert all(row["ms"] > 0 for row in rows)
