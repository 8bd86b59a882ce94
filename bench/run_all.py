"""Every benchmark, outbox beside procrastinate and pgqueuer, in one run on one server.

    python bench/run_all.py            # full sizes, 3 runs of each figure (tens of minutes)
    python bench/run_all.py --quick    # tiny sizes, 1 run: a smoke run of the harness

Writes bench/results/<stamp>.json, docs/benchmarks.png and the generated part of
docs/benchmarks.md (between its `generated` markers). Each figure is the median of the runs,
with min and max; ratios outbox/peer are computed run by run (same run, same moment), then
their median is taken. Within a run the systems of a workload run one after another (workload
by workload), and take turns to go first from run to run (`run_order`).

`--before REV` (default: the build before issue 34's layout, in a full run; none with `--quick`)
also runs outbox's burn-downs with that commit's outbox-core (taken with `git archive`, first on
PYTHONPATH, its own migrations in its own template database), as the system `outbox (REV)`, so
that one run compares this build with the one before it, and with the peers.

The HTTP burn-downs (`http_<latency>ms_c<concurrency>`: each action posts to a loopback server
that answers after the latency) have their own generated part (`generated:http` markers, in the
section of issue 23) and plot (docs/benchmarks_http.png); a run writes only the parts whose
workloads it ran. Within a run, once the loopback server was the limit (its CPU near a core) at
one concurrency, that system's higher concurrencies at the same latency are not run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs"
RESULTS = HERE / "results"
START, END = "<!-- generated:start -->", "<!-- generated:end -->"
DSN = os.environ.get("OUTBOX_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Case:
    """One measured figure of one system: how to run it and which JSON field is the figure."""

    workload: str
    system: str
    command: list[str]
    figure: str = "rate_per_s"
    note: str = ""
    # HTTP burn-downs: the group whose higher levels (concurrencies) are not run once the
    # loopback server was the limit at a lower one, in the same run.
    stop_group: str = ""
    level: int = 0


@dataclass
class Sizes:
    single: int
    bulk: int
    burn: int
    pending: int
    latency: int
    hot_lane: int
    producer_actions: int
    # HTTP burn-downs: actions per (latency in ms, concurrency), each run about 10-15 s.
    http: dict[tuple[int, int], int] = field(default_factory=dict)
    peer_burn: int = 0  # 0: the same as burn

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            single=5_000,
            bulk=10_000,
            burn=100_000,
            pending=1_000_000,
            latency=200,
            hot_lane=5_000,
            producer_actions=4_096,
            # Measured on the 2-core machine (2026-12-01): about 3,000 posts/s at 5 ms, 1,000/s
            # at 50 ms and concurrency 100 (bound by the latency), 2,000/s above.
            http={
                (5, 100): 40_000,
                (5, 500): 40_000,
                (5, 1500): 40_000,
                (50, 100): 15_000,
                (50, 500): 30_000,
                (50, 1500): 30_000,
            },
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            single=100,
            bulk=500,
            burn=1_000,
            pending=2_000,
            latency=10,
            hot_lane=50,
            producer_actions=128,
            # One HTTP burn-down (a burn costs seconds to set up), with a large pool.
            http={(5, 1500): 300},
        )


PEERS = (("procrastinate", "psycopg"), ("pgqueuer", "asyncpg"), ("pgqueuer", "psycopg"))
# The build before issue 34's layout (core migrations 20-22): `--before`'s default.
BEFORE = "749498e234ff5bf4849b9f14d29123f448bf41a9"
# outbox's workloads that the build before runs too (`--before`).
BEFORE_WORKLOADS = (
    "enqueue_single",
    "enqueue_bulk",
    "burn",
    "burn_fenced",
    "burn_traced",
    "burn_traced_sampled",
    "burn_pending",
    "burn_pending_one_lane",
    "burn_pending_not_due",
    "burn_pending_lanes_10k",
)
RAW, RAW_JSON, RAW_NOTIFY = "raw SQL", "raw SQL (JSON batch)", "raw SQL + NOTIFY"
ALONE = "aiohttp alone (no queue)"
# measured by outbox's own scripts
WAITING = "outbox, an executor waiting"
OURS = frozenset({"outbox", WAITING, RAW, RAW_JSON, RAW_NOTIFY, ALONE})
PRODUCERS = (1, 4, 16, 64)
NO_LANES = "no lanes, no fences: each job runs alone"


def cases(sizes: Sizes, peers_python: str) -> list[Case]:
    py = sys.executable
    throughput = [py, str(HERE / "throughput.py")]
    enqueue = [
        py,
        str(HERE / "enqueue.py"),
        "--repeat",
        "1",
        "--single",
        str(sizes.single),
        "--bulk",
        str(sizes.bulk),
    ]
    producers = [
        py,
        str(HERE / "enqueue.py"),
        "--repeat",
        "1",
        "--single",
        "0",
        "--bulk",
        "0",
        "--producers",
        ",".join(str(n) for n in PRODUCERS),
        "--producer-actions",
        str(sizes.producer_actions),
    ]
    lanes = str(max(1, sizes.burn // 10))
    burn_cmd = [*throughput, "burn", "--actions", str(sizes.burn), "--lanes", lanes]
    out = [
        Case(
            "enqueue_single",
            "outbox",
            enqueue,
            "single_per_s",
            "one transaction each; enqueue validates the payload",
        ),
        Case(
            "enqueue_single",
            RAW,
            enqueue,
            "raw_single_per_s",
            "INSERT of the same row + commit: one round trip, no lane row, no wake-up",
        ),
        Case(
            "enqueue_bulk",
            "outbox",
            enqueue,
            "bulk_per_s",
            "enqueue_many: one statement; 1,000 lanes",
        ),
        Case(
            "enqueue_bulk",
            RAW,
            enqueue,
            "raw_bulk_per_s",
            "the same effects (insert, lane upsert, one wake-up, ids returned), "
            "text arrays (unnest)",
        ),
        Case(
            "enqueue_bulk",
            RAW_JSON,
            enqueue,
            "raw_bulk_json_per_s",
            "the same statement as raw SQL, the batch as one JSON document (as enqueue_many)",
        ),
        *(
            case
            for count in PRODUCERS
            for case in (
                Case(
                    f"producers_{count}",
                    "outbox",
                    producers,
                    f"producers_{count}_per_s",
                    f"{count} connections, one transaction per action, each action a lane of "
                    "its own; no executor waits (busy or none): no wake-up",
                ),
                Case(
                    f"producers_{count}",
                    WAITING,
                    producers,
                    f"waiting_producers_{count}_per_s",
                    "an executor waits for work: every enqueue notifies it",
                ),
                Case(f"producers_{count}", RAW, producers, f"raw_producers_{count}_per_s"),
                Case(
                    f"producers_{count}",
                    RAW_NOTIFY,
                    producers,
                    f"raw_notify_producers_{count}_per_s",
                    "the raw INSERT with a NOTIFY in its transaction",
                ),
            )
        ),
        Case(
            "burn",
            "outbox",
            burn_cmd,
            note=f"{lanes} lanes, 1 process",
        ),
        # Traces' cost (docs/benchmarks.md): right after the untraced burn, so that each run's
        # three burns are interleaved; their ratios to it are reported per run.
        Case(
            "burn_traced",
            "outbox",
            [*burn_cmd, "--otel-traces"],
            note="an SDK tracer provider, BatchSpanProcessor to a no-op exporter; every action "
            "enqueued in a sampled span: every attempt a recorded span",
        ),
        Case(
            "burn_traced_sampled",
            "outbox",
            [*burn_cmd, "--otel-sampled", "0.01"],
            note="as burn_traced, but each action a trace of its own, 1 % of them sampled: the "
            "ParentBased sampler drops 99 % of the attempt spans",
        ),
        Case(
            "burn_c1000_pool4",
            "outbox",
            [
                *burn_cmd,
                "--concurrency",
                "1000",
                "--pool-size",
                "4",
            ],
            note="the settings of earlier tables: concurrency 1,000, pool 4 (two batches in flight)",
        ),
        Case(
            "latency",
            "outbox",
            [*throughput, "latency", "--samples", str(sizes.latency)],
            "p50_ms",
            "LISTEN/NOTIFY wake-up",
        ),
        Case(
            "latency_p99",
            "outbox",
            [*throughput, "latency", "--samples", str(sizes.latency)],
            "p99_ms",
        ),
        Case(
            "burn_pending",
            "outbox",
            [
                *burn_cmd,
                "--pending",
                "claimable",
                "--pending-count",
                str(sizes.pending),
            ],
            note="pending: claimable heads of a kind this executor does not serve",
        ),
        *(
            Case(
                f"burn_pending_{shape}",
                "outbox",
                [
                    *burn_cmd,
                    "--pending",
                    shape,
                    "--pending-count",
                    str(sizes.pending),
                ],
                note=f"pending: {what}",
            )
            for shape, what in (
                ("one_lane", "all in one lane behind an executing head"),
                ("not_due", "one per lane, heads waiting out a backoff"),
                ("lanes_10k", "in 10,000 lanes whose heads are executing"),
            )
        ),
        Case(
            "burn_fenced",
            "outbox",
            [*burn_cmd, "--kind", "fenced"],
            note="begin_write() per action",
        ),
        Case(
            "burn_two_processes",
            "outbox",
            [*burn_cmd, "--processes", "2"],
        ),
        Case(
            "burn_hot_lane",
            "outbox",
            [*throughput, "burn", "--actions", str(sizes.hot_lane), "--lanes", "1"],
            note="one lane: strictly one at a time",
        ),
    ]
    for system, driver in PEERS:
        script = str(HERE / "peers" / f"{system}_bench.py")
        name = f"{system} ({driver})"
        burn = sizes.peer_burn or sizes.burn
        for workload, n in (
            ("enqueue_single", sizes.single),
            ("enqueue_bulk", sizes.bulk),
            ("burn", burn),
            ("latency", sizes.latency),
            ("burn_pending", burn),
        ):
            command = [
                peers_python,
                script,
                "--dsn",
                DSN,
                "--workload",
                workload,
                "--n",
                str(n),
                "--driver",
                driver,
            ]
            if workload == "burn_pending":
                command += ["--pending", str(sizes.pending)]
            if workload == "latency":
                out.append(Case("latency", name, command, "p50_ms", NO_LANES))
                out.append(Case("latency_p99", name, command, "p99_ms", NO_LANES))
            else:
                out.append(
                    Case(
                        workload,
                        name,
                        command,
                        note=NO_LANES if workload.startswith("burn") else "",
                    )
                )
    return out + http_cases(sizes, peers_python)


HTTP_START, HTTP_END = "<!-- generated:http:start -->", "<!-- generated:http:end -->"
HTTP_PEER = "pgqueuer (asyncpg)"


def http_workload(latency_ms: int, concurrency: int) -> str:
    return f"http_{latency_ms}ms_c{concurrency}"


def is_http(workload: str) -> bool:
    return workload.startswith("http_")


def http_cases(sizes: Sizes, peers_python: str) -> list[Case]:
    """The HTTP burn-downs: per latency, concurrency rising; per workload outbox, pgqueuer and
    the client alone one after the other, so that each ratio compares the same moment."""
    py = sys.executable
    out = []
    for (latency, concurrency), n in sorted(sizes.http.items()):
        workload = http_workload(latency, concurrency)
        lanes = max(1, n // 10)
        common = ["--concurrency", str(concurrency)]
        out += [
            Case(
                workload,
                "outbox",
                [
                    *(py, str(HERE / "throughput.py"), "burn", "--kind", "http"),
                    *("--http-latency-ms", str(latency), *common),
                    *("--actions", str(n), "--lanes", str(lanes)),
                ],
                note=f"{lanes} lanes of 10 actions, 1 process, claim batch 500, pool 5",
                stop_group=f"http_{latency}ms/outbox",
                level=concurrency,
            ),
            Case(
                workload,
                HTTP_PEER,
                [
                    *(peers_python, str(HERE / "peers" / "pgqueuer_bench.py"), "--dsn", DSN),
                    *("--workload", "burn_http", "--n", str(n), "--driver", "asyncpg"),
                    *("--http-latency-ms", str(latency), *common),
                ],
                note=f"max_concurrent_tasks {concurrency}, batch {min(500, concurrency // 2)}; "
                + NO_LANES,
                stop_group=f"http_{latency}ms/pgqueuer",
                level=concurrency,
            ),
            Case(
                workload,
                ALONE,
                [
                    *(py, str(HERE / "loopback_http.py"), "client"),
                    *("--delay-ms", str(latency), *common, "--requests", str(n)),
                ],
                note="the same posts from one process without a queue: the client's ceiling",
                stop_group=f"http_{latency}ms/alone",
                level=concurrency,
            ),
        ]
    return out


def before_system(commit: str) -> str:
    return f"outbox ({commit[:7]})"


def before_cases(selected: list[Case], commit: str, src: Path) -> list[Case]:
    """outbox's cases of BEFORE_WORKLOADS again, with the outbox-core of `src` (another
    build's) first on PYTHONPATH; each right after this build's, so that they interleave."""
    out = []
    for case in selected:
        out.append(case)
        if case.system == "outbox" and case.workload in BEFORE_WORKLOADS:
            env = ["env", f"PYTHONPATH={os.pathsep.join([str(src), str(HERE)])}"]
            out.append(
                Case(
                    case.workload,
                    before_system(commit),
                    [*env, *case.command],
                    case.figure,
                    f"the build {commit[:7]}" + (f"; {case.note}" if case.note else ""),
                )
            )
    return out


def build_source(commit: str, into: Path) -> Path:
    """A commit's outbox-core/src, from this repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "outbox-core/src"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "outbox-core" / "src"


def run_once(command: list[str], timeout: float) -> dict[str, Any]:
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:4])} failed: {completed.stderr.strip().splitlines()[-1:]}"
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def summary_of(result: dict[str, Any], figure: str) -> float:
    if "summary" in result:  # enqueue.py
        return float(result["summary"][figure]["median"])
    return float(result[figure])


@dataclass
class Table:
    runs: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: dict[tuple[str, str], str] = field(default_factory=dict)
    raw: list[dict[str, Any]] = field(default_factory=list)
    # (workload, system, run): why that run was not made.
    skipped: dict[tuple[str, str, int], str] = field(default_factory=dict)

    def only(self, wanted: Callable[[str], bool]) -> Table:
        """The figures of the workloads that `wanted` accepts."""
        return Table(
            runs={k: v for k, v in self.runs.items() if wanted(k[0])},
            errors={k: v for k, v in self.errors.items() if wanted(k[0])},
            notes={k: v for k, v in self.notes.items() if wanted(k[0])},
            raw=[r for r in self.raw if wanted(r.get("workload", ""))],
            skipped={k: v for k, v in self.skipped.items() if wanted(k[0])},
        )


def loopback_saturated(result: dict[str, Any]) -> bool:
    return bool(result.get("http", {}).get("loopback", {}).get("saturated"))


# Measured after every other system in a run: procrastinate's burn-down takes 100-120 s where
# the others' take 5-10 s, and no target's ratio is taken against it; between the others it put
# two minutes between a burn-down and the figures compared with it (pending, traced, fenced).
LAST_SYSTEMS = ("procrastinate (psycopg)",)


def run_order(selected: list[Case], run: int) -> list[Case]:
    """The cases of one run (``run`` from 0): workload by workload, in the order of their first
    case, so that the systems of a workload run one after the other and a ratio taken run by
    run compares moments seconds apart (system by system, outbox's burn-down and pgqueuer's
    were 7 minutes apart, and this machine's speed moved by a third between them); within a
    workload the systems take turns to go first, run by run, so that none is always the one
    after another's. The systems of ``LAST_SYSTEMS`` go after all the others, in the same
    order."""
    first = [case for case in selected if case.system not in LAST_SYSTEMS]
    last = [case for case in selected if case.system in LAST_SYSTEMS]
    return _turns(first, run) + _turns(last, run)


def _turns(selected: list[Case], run: int) -> list[Case]:
    groups: dict[str, list[Case]] = {}
    for case in selected:
        groups.setdefault(case.workload.removesuffix("_p99"), []).append(case)
    ordered: list[Case] = []
    for group in groups.values():
        systems = list(dict.fromkeys(case.system for case in group))
        turn = run % len(systems)  # the first system of this run's turn
        turns = systems[turn:] + systems[:turn]
        ordered += sorted(group, key=lambda case: turns.index(case.system))
    return ordered


def measure(selected: list[Case], repeat: int, timeout: float) -> Table:
    table = Table()
    cache: dict[tuple[str, ...], dict[str, Any]] = {}
    for run in range(repeat):
        cache.clear()  # one process run serves every figure it reports, within one repeat
        stopped: dict[
            str, int
        ] = {}  # stop group: the level where the loopback server was the limit
        for case in run_order(selected, run):
            key = (case.workload, case.system)
            table.notes[key] = case.note
            if case.stop_group in stopped and case.level > stopped[case.stop_group]:
                table.skipped[(*key, run + 1)] = (
                    f"not run: the loopback server was the limit at concurrency "
                    f"{stopped[case.stop_group]:,}"
                )
                continue
            try:
                result = cache.get(tuple(case.command))
                if result is None:
                    print(
                        f"[run {run + 1}/{repeat}] {case.system}: {case.workload}",
                        file=sys.stderr,
                        flush=True,
                    )
                    started = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S}"
                    load = round(os.getloadavg()[0], 2)  # the 1-minute load average, as uptime
                    result = run_once(case.command, timeout)
                    cache[tuple(case.command)] = result
                    table.raw.append(
                        {
                            "run": run + 1,
                            "workload": case.workload,
                            "at": started,
                            "loadavg": load,
                            "system": case.system,
                            "command": case.command[1:],
                            "result": result,
                        }
                    )
                table.runs.setdefault(key, []).append(summary_of(result, case.figure))
                if case.stop_group and loopback_saturated(result):
                    stopped[case.stop_group] = min(
                        case.level, stopped.get(case.stop_group, case.level)
                    )
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as exc:
                table.errors[key] = str(exc)[:200]
                print(f"  failed: {exc}", file=sys.stderr, flush=True)
    return table


def machine() -> dict[str, Any]:
    with psycopg.connect(DSN) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', "
                "'fsync', 'max_connections', 'work_mem', 'wal_level', 'max_wal_size')"
            ).fetchall()
        )
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "postgresql": version,
        "settings": settings,
        "platform": platform.platform(),
    }


def fmt(value: float, figure_is_latency: bool) -> str:
    return f"{value:.1f} ms" if figure_is_latency else f"{value:,.0f}/s"


def markdown(table: Table, info: dict[str, Any], repeat: int, quick: bool) -> str:
    workloads = list(dict.fromkeys(w for w, _ in table.runs))
    systems = list(dict.fromkeys(s for _, s in [*table.runs, *table.errors]))
    lines = [
        START,
        f"_Generated by `bench/run_all.py{' --quick' if quick else ''}` on "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {info['cores']} cores, Python {info['python']}, "
        f"PostgreSQL {info['postgresql']} ({', '.join(f'{k}={v}' for k, v in sorted(info['settings'].items()))}); "
        f"median of {repeat} run(s) [min – max]._",
        "",
        "![throughput and latency per system](benchmarks.png)",
        "",
        "| workload | " + " | ".join(systems) + " |",
        "| --- |" + " --- |" * len(systems),
    ]
    for workload in workloads:
        latency = workload.startswith("latency")
        cells = []
        for system in systems:
            key = (workload, system)
            values = table.runs.get(key)
            if values:
                cell = f"{fmt(statistics.median(values), latency)} [{fmt(min(values), latency)} – {fmt(max(values), latency)}]"
            elif key in table.errors:
                cell = "failed"
            else:
                cell = "n/a"
            cells.append(cell)
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ratios outbox / peer (median of the per-run ratios; above 1 favours outbox, latency inverted):",
        "",
        "| workload | " + " | ".join(s for s in systems if s != "outbox") + " |",
        "| --- |" + " --- |" * (len(systems) - 1),
    ]
    for workload in workloads:
        ours = table.runs.get((workload, "outbox"))
        if not ours:
            continue
        cells = []
        for system in systems:
            if system == "outbox":
                continue
            theirs = table.runs.get((workload, system))
            if not theirs:
                cells.append("n/a")
                continue
            pairs = list(zip(ours, theirs, strict=False))
            ratios = [
                (t / o) if workload.startswith("latency") else (o / t) for o, t in pairs if o and t
            ]
            cells.append(f"{statistics.median(ratios):.2f}×" if ratios else "n/a")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    lines += traced_ratios(table)
    lines += layout_targets(table)
    notes = sorted({(s, n) for (w, s), n in table.notes.items() if n})
    if notes:
        lines += ["", "Notes:"]
        lines += [
            f"- {workload} / {system}: {note}"
            for (workload, system), note in sorted(table.notes.items())
            if note
        ]
    if table.errors:
        lines += ["", "Failed runs:"] + [
            f"- {w} / {s}: {e}" for (w, s), e in sorted(table.errors.items())
        ]
    lines.append(END)
    return "\n".join(lines)


# The traced burns, each against the untraced burn of the same run (issue 34's targets).
TRACED = {"burn_traced": 0.7, "burn_traced_sampled": 0.95}


def traced_ratios(table: Table) -> list[str]:
    """Lines of the traced burns' rates over the untraced burn's, run by run (their median,
    and the target), when the run measured them."""
    untraced = table.runs.get(("burn", "outbox"))
    found = [(w, table.runs.get((w, "outbox"))) for w in TRACED]
    if not untraced or not any(values for _, values in found):
        return []
    lines = [
        "",
        "Traces' cost: traced burn / untraced burn of the same run (median [min – max]):",
        "",
    ]
    for workload, values in found:
        ratios = [t / u for t, u in zip(values or [], untraced, strict=False) if u]
        if ratios:
            lines.append(
                f"- {workload}: {statistics.median(ratios):.2f}× [{min(ratios):.2f} – "
                f"{max(ratios):.2f}] (target ≥ {TRACED[workload]}×)"
            )
    return lines


def layout_targets(table: Table) -> list[str]:
    """Issue 34's targets, run by run (their median, lowest and highest): the no-op burn-down over
    pgqueuer's with asyncpg, the fenced one over pgqueuer's plain burn, and each pending shape
    over the plain burn of the same build."""
    peer = table.runs.get(("burn", "pgqueuer (asyncpg)"))
    lines: list[str] = []

    def ratio_line(
        label: str, ours: list[float] | None, theirs: list[float] | None, target: float
    ) -> None:
        ratios = [o / t for o, t in zip(ours or [], theirs or [], strict=False) if o and t]
        if ratios:
            lines.append(
                f"- {label}: {statistics.median(ratios):.2f}× [{min(ratios):.2f} – "
                f"{max(ratios):.2f}] (target ≥ {target}×)"
            )

    systems = [
        s
        for s in dict.fromkeys(s for _, s in table.runs)
        if s == "outbox" or s.startswith("outbox (")
    ]
    for system in systems:
        burn = table.runs.get(("burn", system))
        ratio_line(f"{system}, burn / pgqueuer (asyncpg) burn", burn, peer, 1.6)
        ratio_line(
            f"{system}, burn_fenced / pgqueuer (asyncpg) burn",
            table.runs.get(("burn_fenced", system)),
            peer,
            1.1,
        )
        for workload in BEFORE_WORKLOADS:
            if workload.startswith("burn_pending"):
                ratio_line(
                    f"{system}, {workload} / burn", table.runs.get((workload, system)), burn, 0.9
                )
    if not lines:
        return []
    return [
        "",
        "Issue 34's targets, run by run (median [min – max]):",
        "",
        *lines,
    ]


def plot(table: Table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(s for _, s in table.runs))
    throughput = [w for w in dict.fromkeys(w for w, _ in table.runs) if not w.startswith("latency")]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 1]}
    )
    width = 0.8 / max(1, len(systems))
    for index, system in enumerate(systems):
        xs = [i + index * width for i in range(len(throughput))]
        ys = [statistics.median(table.runs.get((w, system), [0])) for w in throughput]
        left.bar(xs, ys, width, label=system)
        xs2 = [index * width, 1 + index * width]
        ys2 = [
            statistics.median(table.runs.get((w, system), [0])) for w in ("latency", "latency_p99")
        ]
        right.bar(xs2, ys2, width, label=system)
    left.set_xticks(
        [i + width * (len(systems) - 1) / 2 for i in range(len(throughput))],
        throughput,
        rotation=20,
        ha="right",
    )
    left.set_ylabel("per second (higher is better)")
    left.set_yscale("log")
    left.set_title("Throughput")
    left.legend(fontsize=8)
    right.set_xticks(
        [width * (len(systems) - 1) / 2, 1 + width * (len(systems) - 1) / 2], ["p50", "p99"]
    )
    right.set_ylabel("ms, enqueue commit to start (lower is better)")
    right.set_title("Idle latency")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_markdown(section: str, docs: Path, start: str = START, end: str = END) -> None:
    page = docs / "benchmarks.md"
    text = page.read_text("utf-8") if page.exists() else "# Benchmarks\n"
    if start not in text:
        text += f"\n{start}\n{end}\n"
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    page.write_text(before + section + after, "utf-8")


# ---------------------------------------------------------------------------
# The HTTP burn-downs' part of the page and their plot
# ---------------------------------------------------------------------------

SERVER_BOUND = "‡"
HTTP_NOTES = {
    "outbox": "one executor process, `concurrency` = the concurrency, claim batch 500, pool 5 "
    "(throughput.py's defaults); the actions in lanes of 10 (actions / 10 lanes); the `BENCH_HTTP` "
    "kind, no fence, one aiohttp session with a pool of `concurrency` connections",
    HTTP_PEER: "one `QueueManager`, `max_concurrent_tasks` = the concurrency, batch size "
    "min(500, concurrency / 2) (pgqueuer wants the cap at least twice the batch), "
    "AsyncpgPoolDriver; the same aiohttp session and pool; " + NO_LANES,
    ALONE: "the same posts by `concurrency` tasks looping over one aiohttp session, no queue and "
    "no database: what one process's client carries",
}


def http_levels(table: Table) -> list[tuple[int, int]]:
    """The (latency, concurrency) pairs measured, in order."""
    found = set()
    for workload, _ in [*table.runs, *table.errors, *((w, s) for w, s, _ in table.skipped)]:
        latency, concurrency = workload.removeprefix("http_").split("ms_c")
        found.add((int(latency), int(concurrency)))
    return sorted(found)


def http_results(table: Table) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Each HTTP run's entry (result, start, load average) by (workload, system, run)."""
    return {(r["workload"], r["system"], r["run"]): r for r in table.raw}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _rate_cell(values: list[float] | None, bound: bool) -> str:
    if not values:
        return "n/a"
    mark = f" {SERVER_BOUND}" if bound else ""
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:,.0f}/s{mark}"
    return f"{median:,.0f}/s [{min(values):,.0f} – {max(values):,.0f}]{mark}"


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def _ratios_cell(ratios: list[float]) -> str:
    if not ratios:
        return "n/a"
    listed = " / ".join(f"{r:.2f}" for r in ratios)
    return f"**{statistics.median(ratios):.2f}×** ({listed})" if len(ratios) > 1 else listed + "×"


def _figure(entry: dict[str, Any] | None, *path: str) -> float | None:
    value: Any = entry["result"] if entry else None
    for name in path:
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
    return float(value) if isinstance(value, int | float) else None


def _cells(
    entries: list[dict[str, Any] | None], path: tuple[str, ...], fmt: str, scale: float = 1.0
) -> str:
    values = [_figure(entry, *path) for entry in entries]
    return " / ".join("–" if v is None else format(v * scale, fmt) for v in values)


def http_markdown(table: Table, info: dict[str, Any], repeat: int, quick: bool) -> str:
    """The generated part of the HTTP section: the medians and ratios, then every run."""
    results = http_results(table)
    runs = sorted({run for _, _, run in results} | {run for _, _, run in table.skipped})
    systems = ("outbox", HTTP_PEER, ALONE)
    loads = [r["loadavg"] for r in table.raw if "loadavg" in r]
    stamps = sorted(r["at"] for r in table.raw if "at" in r)
    lines = [
        HTTP_START,
        f"_Generated by `bench/run_all.py{' --quick' if quick else ''}` "
        f"({stamps[0] if stamps else '?'} – {stamps[-1][11:] if stamps else '?'} UTC, "
        f"load average {min(loads, default=0):.2f}–{max(loads, default=0):.2f} at the runs' "
        f"starts): {info['cores']} cores, Python {info['python']}, PostgreSQL "
        f"{info['postgresql']}; {repeat} run(s), each running every system once, one after "
        "the other, per workload. Rates are posts per second (median [min – max]); ratios are "
        f"taken run by run. {SERVER_BOUND}: the loopback server was the limit (at least "
        "85 % of a core) in a run._",
        "",
        "![posts per second against concurrency](benchmarks_http.png)",
        "",
        "| provider latency | concurrency | outbox | pgqueuer (asyncpg) | outbox / pgqueuer, "
        "median (run by run) | aiohttp alone, no queue | outbox / aiohttp alone | "
        "loopback server, % of a core (outbox / pgqueuer / alone) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for latency, concurrency in http_levels(table):
        workload = http_workload(latency, concurrency)
        cells = []
        for system in systems:
            entries = [results.get((workload, system, run)) for run in runs]
            bound = any(loopback_saturated(e["result"]) for e in entries if e)
            values = table.runs.get((workload, system))
            if not values and any(k[:2] == (workload, system) for k in table.skipped):
                cells.append("not run (server-bound below)")
            elif not values and (workload, system) in table.errors:
                cells.append("failed")
            else:
                cells.append(_rate_cell(values, bound))
        ours = [results.get((workload, "outbox", run)) for run in runs]
        peer = [results.get((workload, HTTP_PEER, run)) for run in runs]
        alone = [results.get((workload, ALONE, run)) for run in runs]
        to_peer = [
            r
            for o, p in zip(ours, peer, strict=True)
            if (r := _ratio(_figure(o, "rate_per_s"), _figure(p, "rate_per_s")))
        ]
        to_alone = [
            r
            for o, a in zip(ours, alone, strict=True)
            if (r := _ratio(_figure(o, "rate_per_s"), _figure(a, "rate_per_s")))
        ]
        shares = [
            _median([v for e in group if (v := _figure(e, "http", "loopback", "core_share"))])
            for group in (ours, peer, alone)
        ]
        share_cell = " / ".join("–" if v is None else f"{v * 100:.0f} %" for v in shares)
        lines.append(
            f"| {latency} ms | {concurrency:,} | {cells[0]} | {cells[1]} | "
            f"{_ratios_cell(to_peer)} | {cells[2]} | {_ratios_cell(to_alone)} | {share_cell} |"
        )
    lines += [
        "",
        "Every run (values outbox / pgqueuer / aiohttp alone, in the order they ran; CPU over "
        "the timed window, from /proc. Executor: outbox's executor process, pgqueuer's bench "
        "process (its worker; the enqueue comes before the window), the client's process. "
        "PostgreSQL: every `postgres` process on the machine, so other work on the server "
        "counts too):",
        "",
        "| workload | run: start (UTC), load | posts/s | outbox / pgqueuer | executor CPU, µs a "
        "post | PostgreSQL CPU, µs a post | loopback server: % of a core, µs a post | answers "
        "late by, mean ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for latency, concurrency in http_levels(table):
        workload = http_workload(latency, concurrency)
        for run in runs:
            entries = [results.get((workload, system, run)) for system in systems]
            present = [e for e in entries if e]
            if not present:
                continue
            first = min(present, key=lambda e: e["at"])
            rates = []
            for system, entry in zip(systems, entries, strict=True):
                if entry is None:
                    skipped = (workload, system, run) in table.skipped
                    rates.append("not run" if skipped else "–")
                    continue
                mark = f" {SERVER_BOUND}" if loopback_saturated(entry["result"]) else ""
                rates.append(f"{entry['result']['rate_per_s']:,.0f}{mark}")
            ratio = _ratio(_figure(entries[0], "rate_per_s"), _figure(entries[1], "rate_per_s"))
            executor = [
                _figure(e, "worker_window_cpu_us_per_action")
                if e and e["system"] == "outbox"
                else _figure(e, "worker_cpu_us_per_action")
                for e in entries
            ]
            executor_cell = " / ".join("–" if v is None else f"{v:,.0f}" for v in executor)
            share = _cells(entries, ("http", "loopback", "core_share"), ".0f", 100)
            per_post = _cells(entries, ("http", "loopback", "cpu_us_per_request"), ".0f")
            lines.append(
                f"| {workload} | {run}: {first['at'][11:16]}, {first['loadavg']:.2f} | "
                f"{' / '.join(rates)} | {'n/a' if ratio is None else f'{ratio:.2f}×'} | "
                f"{executor_cell} | {_cells(entries[:2], ('server_cpu_us_per_action',), ',.0f')} | "
                f"{share} %, {per_post} | "
                f"{_cells(entries, ('http', 'loopback', 'late_mean_ms'), '.1f')} |"
            )
    measured = {system for _, system in table.runs}
    lines += ["", "Settings:"]
    lines += [f"- {system}: {HTTP_NOTES[system]}" for system in systems if system in measured]
    if table.errors:
        lines += ["", "Failed runs:"] + [
            f"- {w} / {s}: {e}" for (w, s), e in sorted(table.errors.items())
        ]
    if table.skipped:
        lines += ["", "Not run:"] + [
            f"- {w} / {s}, run {run}: {why}" for (w, s, run), why in sorted(table.skipped.items())
        ]
    lines.append(HTTP_END)
    return "\n".join(lines)


def http_plot(table: Table, path: Path) -> None:
    """Posts per second against concurrency (left) and the loopback server's CPU (right), one
    line per system and latency; a server-bound point is marked with a cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = http_results(table)
    levels = http_levels(table)
    latencies = sorted({latency for latency, _ in levels})
    colors = {"outbox": "tab:blue", HTTP_PEER: "tab:orange", ALONE: "tab:gray"}
    styles = ["-", "--", ":", "-."]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    for system, color in colors.items():
        for index, latency in enumerate(latencies):
            xs, ys, lows, highs, shares, bound = [], [], [], [], [], []
            for lat, concurrency in levels:
                values = table.runs.get((http_workload(lat, concurrency), system))
                if lat != latency or not values:
                    continue
                entries = [
                    e
                    for (w, s, _), e in results.items()
                    if (w, s) == (http_workload(lat, concurrency), system)
                ]
                median = statistics.median(values)
                xs.append(concurrency)
                ys.append(median)
                lows.append(median - min(values))
                highs.append(max(values) - median)
                share = [_figure(e, "http", "loopback", "core_share") or 0.0 for e in entries]
                shares.append(100 * statistics.median(share) if share else 0.0)
                bound.append(any(loopback_saturated(e["result"]) for e in entries))
            if not xs:
                continue
            label = f"{system}, {latency} ms"
            style = styles[index % len(styles)]
            left.errorbar(
                xs,
                ys,
                yerr=[lows, highs],
                color=color,
                linestyle=style,
                marker="o",
                capsize=3,
                label=label,
                alpha=0.6 if system == ALONE else 1.0,  # the ceiling, behind the queues
            )
            right.plot(xs, shares, color=color, linestyle=style, marker="o", label=label)
            for x, y, b in zip(xs, ys, bound, strict=True):
                if b:
                    left.plot([x], [y], marker="x", markersize=12, color="red")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xticks([c for _, c in levels], [f"{c:,}" for _, c in levels])
        axis.minorticks_off()
        axis.set_xlabel("concurrency (posts in flight at most)")
        axis.legend(fontsize=8)
    left.set_ylabel("posts per second, one worker process (higher is better)")
    left.set_ylim(bottom=0)
    left.set_title("Burn-down through a loopback HTTP provider")
    right.set_ylabel("loopback server CPU, % of one core")
    right.axhline(85, color="red", linewidth=0.8, linestyle=":")
    right.set_ylim(0, 100)
    right.set_title("The provider's own CPU (red: where it would be the limit)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run: a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs of each figure (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated workloads to run (`http`: every HTTP burn-down)",
    )
    parser.add_argument(
        "--peers-python",
        default=sys.executable,
        help="the Python that has procrastinate and pgqueuer",
    )
    parser.add_argument("--no-peers", action="store_true", help="outbox only")
    parser.add_argument(
        "--peers-skip",
        default="",
        help="comma-separated workloads the peers do not run (procrastinate's burn_pending "
        "runs into its timeout: see docs/benchmarks.md)",
    )
    parser.add_argument(
        "--docs", type=Path, default=DOCS, help="where benchmarks.md and the plot go"
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--before",
        default=None,
        help=f"also run outbox's burn-downs with this commit's outbox-core (default {BEFORE[:7]} "
        "in a full run; 'none' for none)",
    )
    parser.add_argument(
        "--peer-burn",
        type=int,
        default=0,
        help="jobs in the peers' burn-downs (default: as outbox's)",
    )
    args = parser.parse_args()
    sizes = Sizes.quick() if args.quick else Sizes.full()
    sizes.peer_burn = args.peer_burn
    repeat = args.repeat or (1 if args.quick else 3)
    selected = [
        c for c in cases(sizes, args.peers_python) if not (args.no_peers and c.system not in OURS)
    ]
    skipped = set(filter(None, args.peers_skip.split(",")))
    selected = [c for c in selected if c.system in OURS or c.workload not in skipped]
    if args.only:
        wanted = set(args.only.split(","))
        selected = [
            c
            for c in selected
            if c.workload in wanted
            or c.workload.removesuffix("_p99") in wanted
            or ("http" in wanted and is_http(c.workload))  # `--only http`: every HTTP burn-down
        ]
    before = args.before or ("none" if args.quick else BEFORE)
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        if before != "none":
            selected = before_cases(selected, before, build_source(before, Path(tmp)))
        table = measure(selected, repeat, args.timeout)
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    (RESULTS / f"{stamp}.json").write_text(
        json.dumps(
            {
                "machine": info,
                "repeat": repeat,
                "quick": args.quick,
                "runs": table.raw,
                # JSON keys are strings: "workload / system" (and " / run").
                "errors": {" / ".join(k): v for k, v in table.errors.items()},
                "skipped": {" / ".join(map(str, k)): v for k, v in table.skipped.items()},
            },
            indent=1,
            default=str,
        )
    )
    args.docs.mkdir(parents=True, exist_ok=True)
    # Each generated part is written only by a run that measured its workloads, so that
    # `--only http` leaves the main table alone, and the other way round.
    main_table = table.only(lambda workload: not is_http(workload))
    if main_table.runs or main_table.errors:
        plot(main_table, args.docs / "benchmarks.png")
        write_markdown(markdown(main_table, info, repeat, args.quick), args.docs)
    http_table = table.only(is_http)
    if http_table.runs or http_table.errors:
        http_plot(http_table, args.docs / "benchmarks_http.png")
        write_markdown(
            http_markdown(http_table, info, repeat, args.quick), args.docs, HTTP_START, HTTP_END
        )
    print(
        json.dumps(
            {
                "figures": {f"{w} / {s}": statistics.median(v) for (w, s), v in table.runs.items()},
                "errors": table.errors,
            },
            indent=1,
        )
    )
    # A peer that fails a workload (procrastinate times out on a large backlog) is a result,
    # reported in the table; only a failure of outbox's own figures fails the run.
    if any(system == "outbox" for _, system in table.errors):
        sys.exit(1)


if __name__ == "__main__":
    main()
