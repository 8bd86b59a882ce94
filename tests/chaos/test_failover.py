"""A primary that fails over (issue 35; docs/reliability.md, "A primary that fails over"), on a
pg_auto_failover formation (:mod:`tests.chaos.failover`) whose standby's clock runs 2 s ahead:

* the CI-sized chaos run with its failovers (:data:`tests.chaos.run.CI_FAILOVER`) keeps every
  invariant of the checker;
* an executor whose connection died mid-ending learns on the new primary whether the ending
  committed: one that committed before its reply was lost is found written (the lost-reply
  check of ``outbox_core/executor/endings.py``) and reported once as ended, one that never
  reached the server is written there; neither is stale, nor run again;
* LISTEN is re-established on the new primary: an action enqueued once the new primary takes
  writes starts long before the poll would have found it, after a planned and an unplanned
  failover;
* a claim's lease is judged by the clock of whichever node is primary: after the failover to
  the node 2 s ahead, the lease that the old primary wrote has 2 s less left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from outbox_core import ActionRequest, OutboxSettings
from outbox_core.executor import Executor
from outbox_core.testing.pgproxy import ReplyLosingProxy

from .failover import HOST, FailoverCluster, failover_cluster, missing
from .plugin import ONCE_KIND, READBACK_KIND
from .run import (
    CI_FAILOVER,
    CI_SIZE,
    chaos_outbox,
    executor_env,
    migrate,
    parse_params,
    provider_record,
    run_chaos,
    start_provider,
)

SKEW = 2.0
REASON = missing(skew=True)
pytestmark = [
    pytest.mark.skipif(
        os.environ.get("CHAOS_SKIP") == "1", reason="CHAOS_SKIP=1: the chaos runs are skipped"
    ),
    pytest.mark.skipif(REASON is not None, reason=f"no failover formation: {REASON}"),
]
PARAMS = replace(CI_SIZE, fail_rate=0.0, drop_rate=0.0)
POLL = 120.0  # the executors' poll: a start that waited for it took LISTEN's place
WAIT = 180.0  # a bound for each wait under load; never reached when all is well


@pytest.fixture(scope="module")
def formation() -> Iterator[FailoverCluster]:
    with failover_cluster("sync", skew={"node2": SKEW}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    proc, port = start_provider(PARAMS, log=tmp_path_factory.mktemp("provider") / "provider.log")
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def database(
    formation: FailoverCluster, provider: int, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh database on the formation, migrated; its multi-host URL. The chaos kinds'
    provider settings in the environment, for the executor's adapters."""
    formation.healthy()
    name = f"t{len(request.node.name)}_{time.time_ns() // 1_000_000}"
    url = formation.database(name)
    migrate(executor_env(PARAMS, url, provider))
    saved = {k: v for k, v in os.environ.items() if k.startswith("OUTBOX_CHAOS_")}
    os.environ["OUTBOX_CHAOS_PROVIDER_URL"] = f"http://127.0.0.1:{provider}"
    os.environ["OUTBOX_CHAOS_REQUEST_TIMEOUT_SECONDS"] = "3"
    try:
        yield url
    finally:
        for key in [k for k in os.environ if k.startswith("OUTBOX_CHAOS_")]:
            del os.environ[key]
        os.environ.update(saved)


def settings(**changes: Any) -> OutboxSettings:
    values: dict[str, Any] = {
        "lease_seconds": 30.0,
        "fence_margin_seconds": 10.0,
        "poll_seconds": POLL,
        "maintenance_seconds": 5.0,
        "shutdown_seconds": 5.0,
    }
    return OutboxSettings(**{**values, **changes})


def enqueue(url: str, kind: str, key: str, **payload: Any) -> tuple[int, float]:
    """One action in a lane of its own; its id, and when its commit returned."""
    with psycopg.connect(url) as conn:
        done = chaos_outbox().enqueue(
            conn, ActionRequest(kind, f"lane-{key}", key, payload={"seq": 1, **payload})
        )
        conn.commit()
    return done.id, time.time()


def row(url: str, action_id: int) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT state, stop_reason, epoch, attempt FROM outbox.agent_action WHERE id = %s",
            (action_id,),
        ).fetchone()
    assert found is not None
    return tuple(found)


def events(caplog: pytest.LogCaptureFixture, name: str, action_id: int) -> int:
    return sum(
        1
        for record in caplog.records
        if getattr(record, "event", None) == name
        and getattr(record, "action.id", None) == action_id
    )


async def until(test: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {WAIT:.0f} s")
        await asyncio.sleep(0.05)


def test_a_ci_sized_failover_chaos_run_keeps_every_invariant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    params = parse_params([], CI_FAILOVER)  # CHAOS_<NAME> variables may change it
    report = run_chaos(params)
    with capsys.disabled():
        print(report.text())
    assert report.verdict.ok, f"{report.verdict.summary()}\nlogs: {report.logs}"
    assert report.durability["synchronous_standby_names"].startswith("ANY 1")
    assert [r["mode"] for r in report.restarts] == ["perform", "kill"]
    assert all(r["first_ending_after_seconds"] is not None for r in report.restarts)
    assert report.restarts[1]["rejoin_seconds"] > 0
    lost = report.verdict.figures["lost"]
    assert (lost["enqueues"], lost["endings"], lost["sent_twice"]) == (0, 0, {}), lost


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_an_ending_whose_connection_died_in_a_failover_is_settled_on_the_new_primary(
    formation: FailoverCluster,
    database: str,
    provider: int,
    caplog: pytest.LogCaptureFixture,
    committed: bool,
) -> None:
    """Committed before the primary went away (its reply lost): the executor finds it written
    on the new primary and reports it once. Not committed (it never reached the server): it
    writes it there. Either way DONE at its first epoch, one effect, not stale, not failed."""
    caplog.set_level(logging.INFO, logger="outbox")
    key = f"lost-reply-{committed}"
    # At most once: an ending left to its lease would end it UNCERTAIN, not DONE.
    x, _ = enqueue(database, ONCE_KIND, key)
    dbname = database.split("/")[-1].split("?")[0]
    proxies = [ReplyLosingProxy(formation.node_url(node, dbname)) for node in formation.nodes]
    primary = formation.nodes.index(formation.primary())
    async with proxies[0].running(), proxies[1].running():
        # The ending commits on the primary (and, synchronously, on its standby) and its
        # answer never comes; or it never reaches the primary. The connection stays open,
        # answered nothing, until the primary goes away.
        if committed:
            proxies[primary].lose_reply_to(b"-- settle\n", hold=True)
        else:
            proxies[primary].lose_statement(b"-- settle\n")
        ports = ",".join(str(p.port) for p in proxies)
        url = (
            f"host={HOST},{HOST} port={ports} dbname={dbname} user=postgres "
            "target_session_attrs=read-write sslmode=disable"
        )
        outbox = chaos_outbox()
        stop = asyncio.Event()
        async with Executor(outbox, url, settings=settings()) as executor:
            task = asyncio.create_task(executor.run(stop))
            await until(lambda: proxies[primary].lost == 1, "lost reply")
            before = await asyncio.to_thread(row, database, x)
            failover = await asyncio.to_thread(formation.perform_failover)
            await until(
                lambda: (
                    events(caplog, "action.ended.done", x) + events(caplog, "action.end.failed", x)
                    > 0
                ),
                "report of the ending",
            )
            stop.set()
            await task
    assert before[0] == ("DONE" if committed else "EXECUTING")
    assert formation.primary().name == failover.new
    assert row(database, x) == ("DONE", "COMPLETED", 1, 1)
    assert events(caplog, "action.ended.done", x) == 1
    assert events(caplog, "action.end.stale", x) == 0
    assert events(caplog, "action.end.failed", x) == 0
    effects = [w for w in provider_record(provider) if w.key == key and w.effect]
    assert len(effects) == 1


@pytest.mark.parametrize("mode", ["perform", "kill"])
async def test_listen_is_re_established_on_the_new_primary(
    formation: FailoverCluster, database: str, provider: int, mode: str
) -> None:
    outbox = chaos_outbox()
    stop = asyncio.Event()
    async with Executor(outbox, database, settings=settings()) as executor:
        task = asyncio.create_task(executor.run(stop))
        waiting = executor.claims.waiting
        await until(lambda: waiting.registered is not None, "registration before the failover")
        before = waiting.listener_pid
        fail = formation.perform_failover if mode == "perform" else formation.kill_primary
        failover = await asyncio.to_thread(fail)
        _, committed = await asyncio.to_thread(enqueue, database, READBACK_KIND, f"listen-{mode}")

        def started() -> float | None:
            writes = [w for w in provider_record(provider) if w.key == f"listen-{mode}"]
            return writes[0].t_start if writes else None

        await until(lambda: started() is not None, "start of the action enqueued after it")
        latency = (started() or 0.0) - committed
        after = waiting.listener_pid
        stop.set()
        await task
    if mode == "kill":
        await asyncio.to_thread(formation.rejoin, failover.old)
    print(f"\n{mode} failover: down {failover.down_seconds:.1f} s, start latency {latency:.2f} s")
    assert after is not None and after != before
    # A LISTEN left on the old primary would leave the start to the poll (POLL s).
    assert latency < POLL / 4, f"started {latency:.1f} s after its enqueue (poll {POLL} s)"


async def test_a_lease_is_judged_by_the_clock_of_the_new_primary(
    formation: FailoverCluster, database: str
) -> None:
    """The lease an action's claim wrote on the old primary, read on each node's clock before
    and after the failover: the node 2 s ahead sees it 2 s shorter (less the time between)."""
    x, _ = enqueue(database, READBACK_KIND, "lease-clock", pause="before_fence")
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1,"
            " lease_until = now() + interval '30 seconds' WHERE id = %s",
            (x,),
        )

    def left() -> tuple[float, float]:
        with psycopg.connect(database) as conn:
            found = conn.execute(
                "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
                " FROM outbox.agent_action WHERE id = %s",
                (x,),
            ).fetchone()
        assert found is not None
        return float(found[0]), time.time()

    old = formation.primary()
    before, at_before = left()
    failover = formation.perform_failover()
    after, at_after = left()
    offsets = {node.name: formation.clock_offset(node) for node in formation.nodes}
    shorter = (before - after) - (at_after - at_before)
    expected = offsets[failover.new] - offsets[old.name]
    print(
        f"\nlease left {before:.2f} s on {old.name}, {after:.2f} s on {failover.new}; "
        f"{shorter:.2f} s shorter than the time between (clock offsets {offsets})"
    )
    assert abs(expected) > SKEW / 2  # the failover went to the other clock
    assert abs(shorter - expected) < 0.5
