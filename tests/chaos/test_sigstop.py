"""SIGSTOP cases (issue 22; docs/reliability.md, "Paused executors"). Each pauses the executor
that holds an action at a known point (the provider's gates, :mod:`tests.chaos.provider`), lets
its lease run out so that the other executor takes the action, and resumes it:

* paused **before its fence**: the fence refuses (or the watchdog ends the overdue attempt),
  and its late ending changes nothing: one effect, from the later claim;
* paused **after its fence**, its write in flight and applied after the other holder read back
  and wrote: no fence stops it. A read-back kind gets a second effect (the checker says so);
  an at-most-once kind still has at most one, and is UNCERTAIN;
* a provider call that **outlasts the fence margin**: the adapter's own timeout (below the
  margin) ends the call inside the lease, so no other claim runs meanwhile: a read-back kind
  finds its effect at the next attempt, an at-most-once kind ends UNCERTAIN.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox_core import ActionRequest

from .checker import ActionRow, check
from .cluster import ChaosCluster, chaos_cluster
from .plugin import KINDS, ONCE_KIND, READBACK_KIND
from .run import (
    CI_SIZE,
    Executors,
    chaos_outbox,
    executor_env,
    migrate,
    provider_record,
    read_actions,
    start_provider,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("CHAOS_SKIP") == "1", reason="CHAOS_SKIP=1: the chaos runs are skipped"
)

# A short lease, so that a paused holder loses it soon; the provider calls' timeouts (half the
# margin) stay below the margin.
PARAMS = replace(CI_SIZE, lease_seconds=6.0, fence_margin_seconds=3.0, fail_rate=0.0, drop_rate=0.0)
WAIT = 180.0  # a bound for each wait under load; never reached when all is well


@dataclass
class Rig:
    cluster: ChaosCluster
    port: int
    env: dict[str, str]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return json.load(r)

    def post(self, path: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).close()

    def enqueue(self, kind: str, key: str, **payload: Any) -> int:
        with psycopg.connect(self.cluster.url) as conn:
            done = chaos_outbox().enqueue(
                conn, ActionRequest(kind, f"lane-{key}", key, payload={"seq": 1, **payload})
            )
            conn.commit()
        return done.id

    def row(self, action_id: int) -> ActionRow:
        return next(a for a in read_actions(self.cluster.url) if a.id == action_id)

    def writes(self, key: str) -> list[Any]:
        return [w for w in provider_record(self.port) if w.key == key]


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    provider, port = start_provider(PARAMS)
    try:
        with chaos_cluster() as cluster:
            env = executor_env(PARAMS, cluster.url, port)
            migrate(env)
            yield Rig(cluster, port, env)
    finally:
        provider.terminate()
        provider.wait(10)


@pytest.fixture(scope="module")
def executors(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executors]:
    """Two executors for the module's tests (each test resumes the one it paused)."""
    running = Executors(rig.env, tmp_path_factory.mktemp("executors"))
    running.start()
    running.start()
    running.wait_started()
    try:
        yield running
    finally:
        for proc, _ in running.running:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        running.stop()


def until(what: str, found: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"waited {WAIT:.0f} s for {what}")


def ended(rig: Rig, action_id: int) -> ActionRow:
    row: ActionRow = until(
        f"action {action_id} to end",
        lambda: (r := rig.row(action_id)).ended_at is not None and r,
    )
    return row


def log_of(executors: Executors, pid: int) -> Path:
    return next(Path(log.name) for proc, log in executors.running if proc.pid == pid)


def paused_at_gate(rig: Rig, key: str) -> int:
    pid: int = until(
        f"a holder of {key} at its gate", lambda: rig.get("/arrivals")["arrivals"].get(key)
    )
    os.kill(pid, signal.SIGSTOP)
    return pid


@pytest.mark.parametrize("kind", KINDS)
def test_paused_before_its_fence_the_late_holder_writes_nothing_and_changes_nothing(
    rig: Rig, executors: Executors, kind: str
) -> None:
    key = f"stop-before-fence-{kind}"
    action_id = rig.enqueue(kind, key, pause="before_fence")
    pid = paused_at_gate(rig, key)
    rig.post("/release", {"key": key})  # its answer waits in the stopped process's socket

    settled = ended(rig, action_id)  # the other executor, after the lease ran out
    assert settled.state == "DONE" and settled.epoch >= 2

    os.kill(pid, signal.SIGCONT)
    log = log_of(executors, pid)
    late = (f"action.abandoned action.id={action_id} ", f"action.end.stale action.id={action_id} ")
    until(
        f"the resumed holder's late ending in {log}",
        lambda: any(m in log.read_text() for m in late),
    )
    assert rig.row(action_id) == settled
    writes = rig.writes(key)
    assert [(w.epoch, w.pid != pid) for w in writes] == [(settled.epoch, True)]


def test_paused_after_its_fence_a_read_back_kind_gets_a_second_effect(
    rig: Rig, executors: Executors
) -> None:
    key = "stop-after-fence-readback"
    action_id = rig.enqueue(READBACK_KIND, key, pause="after_fence")
    pid = paused_at_gate(rig, key)  # its write reached the provider, not yet applied

    settled = ended(rig, action_id)  # read back, found nothing, wrote: DONE
    assert settled.state == "DONE" and settled.epoch >= 2
    rig.post("/release", {"key": key})  # the paused holder's write is applied now
    until("the late write", lambda: len(rig.writes(key)) == 2)
    os.kill(pid, signal.SIGCONT)
    log = log_of(executors, pid)
    stale = f"action.end.stale action.id={action_id} "
    until(f"the resumed holder's stale ending in {log}", lambda: stale in log.read_text())

    assert rig.row(action_id) == settled
    writes = sorted(rig.writes(key), key=lambda w: w.t_end)
    assert [(w.pid == pid, w.late) for w in writes] == [(False, False), (True, True)]
    assert writes[0].epoch == settled.epoch > writes[1].epoch
    verdict = check(writes, [settled], at_most_once=[ONCE_KIND])
    # the duplicate that no fence can stop, and the two writes of the lane overlapped
    assert verdict.failed() == ["effects", "overlap"]


def test_paused_after_its_fence_an_at_most_once_kind_is_uncertain_with_one_effect(
    rig: Rig, executors: Executors
) -> None:
    key = "stop-after-fence-once"
    action_id = rig.enqueue(ONCE_KIND, key, pause="after_fence")
    pid = paused_at_gate(rig, key)

    settled = ended(rig, action_id)  # its write started: never claimed again, reaped
    assert (settled.state, settled.stop_reason) == ("UNCERTAIN", "LEASE_LOST_AFTER_WRITE")
    rig.post("/release", {"key": key})
    until("the late write", lambda: len(rig.writes(key)) == 1)
    os.kill(pid, signal.SIGCONT)
    log = log_of(executors, pid)
    stale = f"action.end.stale action.id={action_id} "
    until(f"the resumed holder's stale ending in {log}", lambda: stale in log.read_text())

    assert rig.row(action_id) == settled
    writes = rig.writes(key)
    assert [(w.pid, w.epoch) for w in writes] == [(pid, settled.epoch)]
    assert check(writes, [settled], at_most_once=[ONCE_KIND]).ok


@pytest.mark.parametrize(
    ("kind", "state", "reason"),
    [(READBACK_KIND, "DONE", "COMPLETED"), (ONCE_KIND, "UNCERTAIN", "WRITE_UNCONFIRMED")],
)
def test_a_provider_call_that_outlasts_the_fence_margin_ends_inside_the_lease(
    rig: Rig, executors: Executors, kind: str, state: str, reason: str
) -> None:
    key = f"slow-call-{kind}"
    rig.post("/hold", {"key": key, "seconds": PARAMS.fence_margin_seconds + 1})
    action_id = rig.enqueue(kind, key)

    settled = ended(rig, action_id)  # before the provider answers: the effect is applied
    assert (settled.state, settled.stop_reason) == (state, reason)
    writes = until("the held write to finish", lambda: rig.writes(key))
    assert [w.late for w in writes] == [False]  # one write
    assert writes[0].t_end - writes[0].t_start >= PARAMS.fence_margin_seconds
    logs = "".join(p.read_text() for p in {Path(log.name) for _, log in executors.running})
    assert f"action.end.stale action.id={action_id} " not in logs  # nobody took it meanwhile
    assert f"action.attempt.timed_out action.id={action_id} " not in logs
    assert check(writes, [settled], at_most_once=[ONCE_KIND]).ok
