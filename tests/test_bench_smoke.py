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
        "burn_traced",
        "burn_traced_sampled",
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
        ("producers_16", run_all.WAITING),
    ):
        assert figures[f"{workload} / {system}"] > 0, (workload, system)
    for system in ("outbox", run_all.ALONE):
        assert figures[f"http_5ms_c1500 / {system}"] > 0, system
    page = (tmp_path / "benchmarks.md").read_text()
    assert run_all.START in page and "| burn |" in page
    assert "- burn_traced_sampled: " in page.split("Traces' cost", 1)[1]
    assert (tmp_path / "benchmarks.png").stat().st_size > 10_000
    http_part = page.split(run_all.HTTP_START, 1)[1].split(run_all.HTTP_END, 1)[0]
    assert "| 5 ms | 1,500 |" in http_part
    assert "| burn |" not in http_part
    assert (tmp_path / "benchmarks_http.png").stat().st_size > 10_000


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


def test_a_run_measures_workload_by_workload_and_the_systems_take_turns_to_go_first() -> None:
    """The systems of a workload run one after the other (a ratio run by run compares moments
    seconds apart), a workload's _p99 figure with it; the first system changes from run to run."""
    cases = [
        run_all.Case(workload, system, [system, workload])
        for system in ("outbox", "outbox (before)", "pgqueuer (asyncpg)")
        for workload in ("burn", "latency", "latency_p99")
    ]
    orders = [
        [(case.workload, case.system) for case in run_all.run_order(cases, run)] for run in range(3)
    ]
    assert orders[0] == [
        ("burn", "outbox"),
        ("burn", "outbox (before)"),
        ("burn", "pgqueuer (asyncpg)"),
        ("latency", "outbox"),
        ("latency_p99", "outbox"),
        ("latency", "outbox (before)"),
        ("latency_p99", "outbox (before)"),
        ("latency", "pgqueuer (asyncpg)"),
        ("latency_p99", "pgqueuer (asyncpg)"),
    ]
    assert [order[0][1] for order in orders] == [
        "outbox",
        "outbox (before)",
        "pgqueuer (asyncpg)",
    ]
    assert orders[1][:3] == [
        ("burn", "outbox (before)"),
        ("burn", "pgqueuer (asyncpg)"),
        ("burn", "outbox"),
    ]
    assert all(sorted(order) == sorted(orders[0]) for order in orders)
    # procrastinate's burn-down takes minutes: it goes after the others, not between them.
    slow = [run_all.Case("burn", "procrastinate (psycopg)", ["p"]), *cases]
    assert [case.system for case in run_all.run_order(slow, 0)][-1] == "procrastinate (psycopg)"


def _http_result(rate: float, saturated: bool) -> dict[str, object]:
    loopback = {"core_share": 0.9 if saturated else 0.1, "saturated": saturated}
    return {"rate_per_s": rate, "worker_cpu_us_per_action": 100.0, "http": {"loopback": loopback}}


def test_a_system_stops_raising_concurrency_once_the_loopback_server_was_the_limit() -> None:
    def case(system: str, concurrency: int, saturated: bool) -> run_all.Case:
        result = json.dumps(_http_result(1000.0, saturated))
        return run_all.Case(
            run_all.http_workload(5, concurrency),
            system,
            [sys.executable, "-c", f"print({result!r})"],
            stop_group=f"http_5ms/{system}",
            level=concurrency,
        )

    cases = [
        case("outbox", 100, False),
        case("pgqueuer (asyncpg)", 100, False),
        case("outbox", 500, True),  # the server was the limit here: 1,500 is not run
        case("pgqueuer (asyncpg)", 500, False),
        case("outbox", 1500, False),
        case("pgqueuer (asyncpg)", 1500, False),
    ]
    table = run_all.measure(cases, repeat=2, timeout=60)
    assert len(table.runs[("http_5ms_c500", "outbox")]) == 2
    assert ("http_5ms_c1500", "outbox") not in table.runs
    assert set(table.skipped) == {("http_5ms_c1500", "outbox", 1), ("http_5ms_c1500", "outbox", 2)}
    assert len(table.runs[("http_5ms_c1500", "pgqueuer (asyncpg)")]) == 2


def test_the_http_part_takes_ratios_run_by_run_and_marks_a_server_bound_run(
    tmp_path: Path,
) -> None:
    rates = {
        "outbox": (100.0, 300.0),
        run_all.HTTP_PEER: (50.0, 300.0),
        run_all.ALONE: (400.0, 600.0),
    }
    raw = [
        {
            "run": run + 1,
            "workload": "http_5ms_c100",
            "at": f"2026-12-01 12:0{run}:00",
            "loadavg": 1.0,
            "system": system,
            "result": _http_result(pair[run], saturated=system == run_all.ALONE and run == 1),
        }
        for system, pair in rates.items()
        for run in range(2)
    ]
    table = run_all.Table(
        runs={("http_5ms_c100", system): list(pair) for system, pair in rates.items()}, raw=raw
    )
    info = {"cores": 2, "python": "3.11", "postgresql": "15", "settings": {}}
    text = run_all.http_markdown(table, info, 2, quick=True)
    # Per-run ratios 2.0 and 1.0: their median 1.5, not the ratio of the medians (200/175).
    assert "**1.50×** (2.00 / 1.00)" in text
    assert f"600 {run_all.SERVER_BOUND}" in text
    run_all.http_plot(table, tmp_path / "plot.png")
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
