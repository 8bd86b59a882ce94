"""Every benchmark, outbox beside procrastinate and pgqueuer, in one run on one server.

    python bench/run_all.py            # full sizes, 3 runs of each figure (tens of minutes)
    python bench/run_all.py --quick    # tiny sizes, 1 run: a smoke run of the harness

Writes bench/results/<stamp>.json, docs/benchmarks.png and the generated part of
docs/benchmarks.md (between its `generated` markers). Each figure is the median of the runs,
with min and max; ratios outbox/peer are computed run by run (same run, same moment), then
their median is taken. Runs of one workload are interleaved across systems.
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
from dataclasses import dataclass, field
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


@dataclass
class Sizes:
    single: int
    bulk: int
    burn: int
    pending: int
    latency: int
    hot_lane: int
    producer_actions: int
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
        )


PEERS = (("procrastinate", "psycopg"), ("pgqueuer", "asyncpg"), ("pgqueuer", "psycopg"))
RAW, RAW_JSON, RAW_NOTIFY = "raw SQL", "raw SQL (JSON batch)", "raw SQL + NOTIFY"
OURS = frozenset({"outbox", RAW, RAW_JSON, RAW_NOTIFY})  # measured by outbox's own scripts
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
                    f"{count} connections, one transaction per action",
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
    return out


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


def measure(selected: list[Case], repeat: int, timeout: float) -> Table:
    table = Table()
    cache: dict[tuple[str, ...], dict[str, Any]] = {}
    for run in range(repeat):
        cache.clear()  # one process run serves every figure it reports, within one repeat
        for case in selected:
            key = (case.workload, case.system)
            table.notes[key] = case.note
            try:
                result = cache.get(tuple(case.command))
                if result is None:
                    print(
                        f"[run {run + 1}/{repeat}] {case.system}: {case.workload}",
                        file=sys.stderr,
                        flush=True,
                    )
                    result = run_once(case.command, timeout)
                    cache[tuple(case.command)] = result
                    table.raw.append(
                        {
                            "run": run + 1,
                            "system": case.system,
                            "command": case.command[1:],
                            "result": result,
                        }
                    )
                table.runs.setdefault(key, []).append(summary_of(result, case.figure))
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


def write_markdown(section: str, docs: Path) -> None:
    page = docs / "benchmarks.md"
    text = page.read_text("utf-8") if page.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text:
        text += f"\n{START}\n{END}\n"
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    page.write_text(before + section + after, "utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run: a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs of each figure (default 3, 1 with --quick)"
    )
    parser.add_argument("--only", default=None, help="comma-separated workloads to run")
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
            c for c in selected if c.workload in wanted or c.workload.removesuffix("_p99") in wanted
        ]
    info = machine()
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
                "errors": table.errors,
            },
            indent=1,
            default=str,
        )
    )
    args.docs.mkdir(parents=True, exist_ok=True)
    plot(table, args.docs / "benchmarks.png")
    write_markdown(markdown(table, info, repeat, args.quick), args.docs)
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
