"""Executor throughput and latency on this machine.

Burn-down: N actions over L lanes, enqueued before the executors start, then timed from the
moment the executor processes are told to go until the last action ended (both on the
database clock). Optionally with a million other actions pending, at lower ids, in one of
four shapes. Latency: an idle executor, actions enqueued one at a time; enqueue commit to
adapter start, p50/p99.

`--kind http`: each action posts to a loopback HTTP server (bench/loopback_http.py, a process
of its own) that answers after `--http-latency-ms`; the result adds that server's CPU over the
timed window (`loopback`) and whether it was the limit (`loopback.saturated`).

    python bench/throughput.py burn --kind noop --processes 1 [--pending SHAPE]
    python bench/throughput.py burn --kind http --http-latency-ms 5 --concurrency 500
    python bench/throughput.py latency --samples 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    BENCH_KINDS,
    HTTP_URL_ENV,
    BenchLatency,
    Timer,
    bench_database,
    emit,
    log,
    percentile,
    postgres_cpu_seconds,
)
from loopback_http import LoopbackServer, process_cpu_seconds, server_figures

from outbox_core import ActionRequest, KindRegistry, Outbox, OutboxSettings
from outbox_core.executor import Executor
from outbox_core.executor.collector import tune_collector

KINDS = {
    "noop": "BENCH_NOOP",
    "fenced": "BENCH_FENCED",
    "latency": "BENCH_LATENCY",
    "filtered": "BENCH_FILTERED",
    "http": "BENCH_HTTP",
}
PENDING_SHAPES = ("none", "one_lane", "claimable", "not_due", "lanes_10k")

# Pending rows are written straight into the tables (setup, not measured), in the shape an
# enqueue would leave them. %(n)s rows; every shape's lane rows are consistent with its actions.
PENDING_SQL = {
    "one_lane": [
        "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts) "
        "VALUES ('BENCH_NOOP', false, true, 'pending-hot', 'pending-head', '{}', 5)",
        # The head is executing under a lease that outlasts the run (a claim, as the trigger allows).
        "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() + interval '1 day' "
        "WHERE idempotency_key = 'pending-head'",
        "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts) "
        "SELECT 'BENCH_NOOP', false, true, 'pending-hot', 'pending-' || g, '{}', 5 FROM generate_series(2, %(n)s) g",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT 'pending-hot', now() + interval '1 day', min(id), 'BENCH_NOOP' FROM outbox.agent_action WHERE lane_key = 'pending-hot'",
    ],
    "claimable": [
        "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts) "
        "SELECT 'BENCH_OTHER', false, true, 'pending-' || g, 'pending-' || g, '{}', 5 FROM generate_series(1, %(n)s) g",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT lane_key, due_at, id, kind FROM outbox.agent_action WHERE kind = 'BENCH_OTHER'",
    ],
    "not_due": [
        "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts, due_at, attempt, last_result) "
        "SELECT 'BENCH_NOOP', false, true, 'pending-' || g, 'pending-' || g, '{}', 5, now() + interval '1 day', 1, 'Retry' FROM generate_series(1, %(n)s) g",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT lane_key, due_at, id, kind FROM outbox.agent_action WHERE lane_key LIKE 'pending-%%'",
    ],
    "lanes_10k": [
        "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts) "
        "SELECT 'BENCH_NOOP', false, true, 'pending-' || (g %% 10000), 'pending-' || g, '{}', 5 FROM generate_series(1, %(n)s) g",
        # Each lane's first action is executing under a lease that outlasts the run.
        "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() + interval '1 day' "
        "WHERE id IN (SELECT min(id) FROM outbox.agent_action WHERE lane_key LIKE 'pending-%%' GROUP BY lane_key)",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT lane_key, now() + interval '1 day', min(id), 'BENCH_NOOP' FROM outbox.agent_action WHERE lane_key LIKE 'pending-%%' GROUP BY lane_key",
    ],
}

# --otel-sampled: each measured action's stored context a trace of its own (ids from md5 of the
# id), sampled (flags 01) for one action in %(every)s and unsampled (00) for the others.
SAMPLED_CONTEXTS = (
    "UPDATE outbox.agent_action SET trace_context = jsonb_build_object('traceparent', "
    "'00-' || md5(id::text) || '-' || left(md5('span-' || id), 16) || "
    "CASE WHEN id %% %(every)s = 0 THEN '-01' ELSE '-00' END) "
    "WHERE lane_key >= 'mlane' AND lane_key < 'mlanf'"
)


def worker_settings(args: argparse.Namespace) -> OutboxSettings:
    return OutboxSettings(
        schema_name="outbox",
        concurrency=args.concurrency,
        claim_batch=args.claim_batch,
        pool_size=args.pool_size,
        poll_seconds=1.0,
    )


def bench_registry() -> KindRegistry:
    registry = KindRegistry()
    for kind in BENCH_KINDS:
        registry.register(kind, distribution="bench")
    return registry


async def worker(args: argparse.Namespace) -> None:
    """One executor process: says `ready`, waits for the go notification, runs until SIGTERM."""
    import signal

    settings = worker_settings(args)
    if args.otel_sdk:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    if args.otel_traces:
        set_up_tracing()
    outbox = Outbox(schema="outbox", registry=bench_registry(), settings=settings)
    executor = Executor(outbox, args.url, settings=settings, kinds=[KINDS[args.kind]])
    tune_collector()  # as `outbox run` does
    await executor.open()
    listener = await psycopg.AsyncConnection.connect(args.url, autocommit=True)
    await listener.execute("LISTEN bench_go")
    print("ready", flush=True)
    async for _ in listener.notifies():
        break
    await listener.close()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    await executor.run(stop)
    await executor.close()
    if args.profile:
        profiler.disable()
        profiler.dump_stats(args.profile + f".{os.getpid()}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"rss_mb {usage.ru_maxrss / 1024:.1f}", flush=True)
    print(f"cpu_s {usage.ru_utime + usage.ru_stime:.3f}", flush=True)


def set_up_tracing() -> None:
    """An OpenTelemetry SDK tracer provider whose spans go through a batch processor (as an
    application's would) to an exporter that drops them: the cost of making spans, not of
    shipping them. The sampler is the SDK's default, ParentBased(ALWAYS_ON): an attempt is
    recorded when the request that enqueued it was (--otel-sampled sets how many were)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    provider.add_span_processor(BatchSpanProcessor(Dropped(), max_queue_size=200_000))
    trace.set_tracer_provider(provider)


def start_workers(url: str, args: argparse.Namespace, kind: str) -> list[subprocess.Popen[str]]:
    command = [
        sys.executable,
        __file__,
        "worker",
        "--url",
        url,
        "--kind",
        kind,
        "--concurrency",
        str(args.concurrency),
        "--claim-batch",
        str(args.claim_batch),
        "--pool-size",
        str(args.pool_size),
    ]
    if args.profile:
        command += ["--profile", args.profile]
    if args.otel_sdk:
        command.append("--otel-sdk")
    if args.otel_traces or args.otel_sampled is not None:
        command.append("--otel-traces")
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ})
        for _ in range(args.processes)
    ]
    for proc in procs:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready or proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker did not start")
    return procs


def stop_workers(procs: list[subprocess.Popen[str]]) -> dict[str, list[float]]:
    """SIGTERM each worker; collect what each reports at exit (rss_mb, cpu_s)."""
    reports: dict[str, list[float]] = {"rss_mb": [], "cpu_s": []}
    for proc in procs:
        proc.terminate()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        for line in out.splitlines():
            name, _, value = line.partition(" ")
            if name in reports:
                reports[name].append(float(value))
    return reports


def burn(args: argparse.Namespace) -> dict[str, Any]:
    kind = KINDS[args.kind]
    with contextlib.ExitStack() as stack:
        loopback = None
        if args.kind == "http":
            loopback = stack.enter_context(LoopbackServer(args.http_latency_ms))
            os.environ[HTTP_URL_ENV] = loopback.url  # the workers inherit it
        result = burn_in(args, kind, loopback)
    if loopback is not None:
        window = result.pop("_loopback_window")
        result["http"] = {
            "latency_ms": args.http_latency_ms,
            "loopback": server_figures(
                loopback.report, window["cpu_s"], window["seconds"], args.actions
            ),
        }
    return result


def probe(conn: psycopg.Connection[Any], query: str, start: int, kind: str) -> int | None:
    """The first live measured action at or after ``start``, or None."""
    row = conn.execute(query, (start, kind)).fetchone()
    return None if row is None else int(row[0])


def burn_in(args: argparse.Namespace, kind: str, loopback: LoopbackServer | None) -> dict[str, Any]:
    with bench_database() as db:
        outbox = db.outbox
        with psycopg.connect(db.url, autocommit=True) as conn:
            if args.pending != "none":
                with Timer() as timer:
                    for statement in PENDING_SQL[args.pending]:
                        conn.execute(statement, {"n": args.pending_count})
                    conn.execute("VACUUM ANALYZE outbox.agent_action")
                    conn.execute("VACUUM ANALYZE outbox.action_lane")
                log(f"pending {args.pending}: {args.pending_count:,} rows in {timer.seconds:.1f} s")
        payload = {"mode": "fast"} if args.kind == "filtered" else {}
        if args.otel_traces and args.otel_sampled is None:
            # Enqueued inside a span, so that every action carries a trace context to join.
            from opentelemetry import trace

            set_up_tracing()
            enqueuing = trace.get_tracer("bench").start_as_current_span("bench enqueue")
        else:
            enqueuing = contextlib.nullcontext()
        with enqueuing, psycopg.connect(db.url) as conn:
            for start in range(0, args.actions, 10_000):
                stop = min(start + 10_000, args.actions)
                outbox.enqueue_many(
                    conn,
                    [
                        ActionRequest(kind, f"mlane{i % args.lanes}", f"m-{i}", payload=payload)
                        for i in range(start, stop)
                    ],
                )
                conn.commit()
        with psycopg.connect(db.url, autocommit=True) as conn:
            if args.otel_sampled is not None:
                # Each action the trace of a request of its own, one in 1/share of them sampled
                # (flags 01), the others not (00), as a ratio sampler at the requests leaves them.
                conn.execute(SAMPLED_CONTEXTS, {"every": round(1 / args.otel_sampled)})
            conn.execute("VACUUM ANALYZE outbox.agent_action")
            conn.execute("VACUUM ANALYZE outbox.action_lane")
            # Start from a clean checkpoint, as the peers' harness does: a million pending rows
            # write half a GB of WAL, and the checkpoint that it triggers otherwise runs during
            # the burn, and every page the burn touches first costs a full-page image.
            conn.execute("CHECKPOINT")
            if args.statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
        with psycopg.connect(db.url, autocommit=True) as conn:
            first_measured = conn.execute(
                "SELECT min(id) FROM outbox.agent_action WHERE lane_key >= 'mlane' AND lane_key < 'mlanf'"
            ).fetchone()[0]  # type: ignore[index]
        procs = start_workers(db.url, args, args.kind)
        cpu_before = postgres_cpu_seconds()
        workers_before = sum(process_cpu_seconds(proc.pid) for proc in procs)
        loopback_before = loopback.cpu_seconds() if loopback is not None else 0.0
        window_started = time.monotonic()
        with psycopg.connect(db.url, autocommit=True) as conn:
            go_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            conn.execute("NOTIFY bench_go")
            deadline = time.monotonic() + args.timeout
            # Whether a measured action still lives: the first live one in id order from the
            # last one found (the measured actions were enqueued last, and none is added, so
            # the lowest live id only rises), through the primary key, so that each probe reads
            # the rows ended since the last one, whichever build's indexes the table has. The
            # probe it replaced tested the lane range through the live-lane partial index,
            # which issue 34's layout dropped: with a million other actions of the kind it took
            # 0.46 s a probe, twice a second, on the cores the burn runs on (3.2 s of the not-due
            # shape's 8.1 s of server time). The statistics, taken while every measured action
            # was live, make the planner expect an early hit in a sequential scan; the probe's
            # connection takes the index.
            conn.execute("SET enable_seqscan = off")
            live_query = (
                "SELECT id FROM outbox.agent_action WHERE id >= %s AND kind = %s "
                "AND lane_key >= 'mlane' AND lane_key < 'mlanf' AND state IN ('ADMITTED', 'EXECUTING') "
                "ORDER BY id LIMIT 1"
            )
            live = int(first_measured)
            while (found := probe(conn, live_query, live, kind)) is not None:
                live = found
                if time.monotonic() > deadline:
                    stop_workers(procs)
                    raise TimeoutError("the burn-down did not finish in time")
                time.sleep(0.5)
            # Before the counts below, which scan the table.
            server_cpu = postgres_cpu_seconds() - cpu_before
            workers_cpu = sum(process_cpu_seconds(proc.pid) for proc in procs) - workers_before
            loopback_cpu = loopback.cpu_seconds() - loopback_before if loopback else 0.0
            window_seconds = time.monotonic() - window_started
            end_at = conn.execute(
                "SELECT max(ended_at) FROM outbox.agent_action WHERE kind = %s AND lane_key LIKE 'mlane%%'",
                (kind,),
            ).fetchone()[0]  # type: ignore[index]
            done = conn.execute(
                "SELECT count(*) FROM outbox.agent_action WHERE kind = %s AND state = 'DONE' AND lane_key LIKE 'mlane%%'",
                (kind,),
            ).fetchone()[0]  # type: ignore[index]
            statements = None
            if args.statements:
                statements = conn.execute(
                    "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), left(regexp_replace(query, '\\s+', ' ', 'g'), 90) "
                    "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 20"
                ).fetchall()
        reports = stop_workers(procs)
    seconds = (end_at - go_at).total_seconds()
    result = {
        "bench": "burn",
        "kind": args.kind,
        "processes": args.processes,
        "pending": args.pending,
        "pending_count": args.pending_count if args.pending != "none" else 0,
        "actions": args.actions,
        "lanes": args.lanes,
        "done": done,
        "seconds": round(seconds, 3),
        "rate_per_s": round(args.actions / seconds),
        "max_rss_mb": max(reports["rss_mb"], default=None),
        "worker_cpu_us_per_action": round(sum(reports["cpu_s"]) / args.actions * 1e6, 1),
        # The workers' CPU from go to the end of the burn only (/proc), without their start.
        "worker_window_cpu_us_per_action": round(workers_cpu / args.actions * 1e6, 1),
        "worker_core_share": round(workers_cpu / window_seconds, 3),
        "server_cpu_us_per_action": round(server_cpu / args.actions * 1e6, 1),
        "server_core_share": round(server_cpu / window_seconds, 3),
        "settings": {
            "concurrency": args.concurrency,
            "claim_batch": args.claim_batch,
            "pool_size": args.pool_size,
        },
    }
    if statements:
        result["pg_stat_statements"] = [list(map(str, row)) for row in statements]
    if loopback is not None:
        result["_loopback_window"] = {"cpu_s": loopback_cpu, "seconds": window_seconds}
    return result


def latency(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, bench_database() as db:
        starts = Path(folder) / "starts.txt"
        os.environ["OUTBOX_BENCH_STARTS"] = str(starts)
        args.processes = 1
        procs = start_workers(db.url, args, "latency")
        committed: dict[int, float] = {}
        with psycopg.connect(db.url, autocommit=True) as go:
            go.execute("NOTIFY bench_go")
        time.sleep(1.0)  # the executor's first claim finds nothing and it goes idle
        with psycopg.connect(db.url) as conn:
            for i in range(args.samples):
                action_id = db.outbox.enqueue(
                    conn, ActionRequest("BENCH_LATENCY", f"lat-{i}", f"lat-{i}")
                ).id
                conn.commit()
                committed[action_id] = time.time()
                time.sleep(args.gap)
            deadline = time.monotonic() + 30
            live = "SELECT count(*) FROM outbox.agent_action WHERE kind = 'BENCH_LATENCY' AND ended_at IS NULL"
            while conn.execute(live).fetchone()[0] and time.monotonic() < deadline:  # type: ignore[index]
                time.sleep(0.05)
        stop_workers(procs)
        started = {
            int(a): float(b) for a, b in (line.split() for line in starts.read_text().splitlines())
        }
    waits = [(started[i] - committed[i]) * 1000 for i in committed if i in started]
    return {
        "bench": "latency",
        "samples": len(waits),
        "p50_ms": round(percentile(waits, 50), 2),
        "p99_ms": round(percentile(waits, 99), 2),
        "max_ms": round(max(waits), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["burn", "latency", "worker"])
    parser.add_argument("--kind", choices=sorted(KINDS), default="noop")
    parser.add_argument("--actions", type=int, default=100_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--pending", choices=PENDING_SHAPES, default="none")
    parser.add_argument("--pending-count", type=int, default=1_000_000)
    # Three batches of endings in flight (pool 5) of about a claim batch each (concurrency
    # 1,500): the setting for throughput on two cores (docs/benchmarks.md). Earlier tables
    # used concurrency 1,000 and pool 4; run_all.py measures that too (burn_c1000_pool4).
    parser.add_argument("--concurrency", type=int, default=1500)
    parser.add_argument("--claim-batch", type=int, default=500)
    parser.add_argument("--pool-size", type=int, default=5)
    parser.add_argument(
        "--http-latency-ms",
        type=float,
        default=5.0,
        help="--kind http: the loopback server answers each post after this many ms",
    )
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--profile", default=None, help="cProfile each worker into PATH.<pid>")
    parser.add_argument(
        "--statements", action="store_true", help="report pg_stat_statements (needs the extension)"
    )
    parser.add_argument(
        "--otel-sdk",
        action="store_true",
        help="configure an OpenTelemetry SDK in each worker (needs opentelemetry-sdk)",
    )
    parser.add_argument(
        "--otel-traces",
        action="store_true",
        help="trace: enqueue inside a span and configure an OpenTelemetry SDK tracer provider "
        "in each worker (spans made, then dropped; needs opentelemetry-sdk)",
    )
    parser.add_argument(
        "--otel-sampled",
        type=float,
        default=None,
        metavar="SHARE",
        help="trace as --otel-traces, but each action stores a trace context of its own, of "
        "which this share (0.01) is sampled: the workers' ParentBased sampler drops the rest",
    )
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    if args.mode == "worker":
        asyncio.run(worker(args))
        if args.kind == "latency":
            starts = "".join(f"{action_id} {at:.6f}\n" for action_id, at in BenchLatency.starts)
            Path(os.environ["OUTBOX_BENCH_STARTS"]).write_text(starts)
        return
    emit(burn(args) if args.mode == "burn" else latency(args))


if __name__ == "__main__":
    main()
