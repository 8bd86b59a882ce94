"""One chaos run: N ``outbox run`` processes against a private PostgreSQL, a producer enqueueing
into running lanes, a SIGKILL loop with replacements, PostgreSQL restarted with ``-m fast`` and
``-m immediate``, and the provider of :mod:`tests.chaos.provider`; then the verdict of
:mod:`tests.chaos.checker` and the figures.

``python -m tests.chaos.run`` (from the repository's root; ``nox -s chaos`` runs it) runs the
full size; ``--help`` lists the parameters, each also ``CHAOS_<NAME>`` in the environment
(``CHAOS_ACTIONS=5000``). ``tests/chaos/test_chaos_run.py`` runs :data:`CI_SIZE` in the
default ``nox``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from outbox_core import ActionRequest, Outbox, build_host

from .checker import ActionRow, Verdict, check
from .cluster import ChaosCluster, chaos_cluster
from .plugin import ONCE_KIND, READBACK_KIND
from .provider import Write

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests.chaos.plugin"
ENDED_SQL = "('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')"


@dataclass(frozen=True)
class ChaosParams:
    executors: int = 4
    actions: int = 20_000
    lanes: int = 2_000
    once_share: float = 0.5  # the share of at-most-once actions
    enqueue_seconds: float = 150.0  # the producer spreads its batches over this long
    batch: int = 200
    kill_min_seconds: float = 0.6  # between two SIGKILLs, drawn uniformly
    kill_max_seconds: float = 1.6
    restarts: str = "fast,immediate"  # PostgreSQL restarts, evenly spread over the enqueueing
    lease_seconds: float = 10.0
    fence_margin_seconds: float = 4.0
    concurrency: int = 50
    fail_rate: float = 0.08
    drop_rate: float = 0.05
    seed: int = 1
    drain_seconds: float = 600.0  # after the producer: how long the actions may take to end
    min_kills: int = 0  # the kill loop goes on after the producer until this many kills

    @property
    def restart_modes(self) -> list[str]:
        return [m.strip() for m in self.restarts.split(",") if m.strip()]


CI_SIZE = ChaosParams(
    executors=3,
    actions=1_500,
    lanes=150,
    enqueue_seconds=30.0,
    batch=50,
    kill_min_seconds=2.0,
    kill_max_seconds=4.0,
    lease_seconds=8.0,
    fence_margin_seconds=4.0,
    concurrency=20,
    drain_seconds=300.0,
    min_kills=3,
)


@dataclass
class Report:
    params: ChaosParams
    durability: dict[str, str]
    verdict: Verdict
    kills: int
    executors_started: int
    restarts: list[dict[str, Any]]
    seconds: float
    logs: Path
    figures: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "params": dataclasses.asdict(self.params),
            "durability": self.durability,
            "ok": self.verdict.ok,
            "violations": {k: v[:20] for k, v in self.verdict.violations.items() if v},
            "kills": self.kills,
            "executors_started": self.executors_started,
            "restarts": self.restarts,
            "seconds": round(self.seconds, 1),
            "cpus": os.cpu_count(),
            "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
            "figures": self.verdict.figures,
        }


class Executors:
    """The ``outbox run`` processes: started, killed, replaced, stopped; one log file each."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.running: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        self.started = 0
        self.kills = 0

    def start(self) -> None:
        self.started += 1
        log = (self.logs / f"executor-{self.started:04d}.log").open("wb")
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "outbox"), "run"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.running.append((proc, log))

    def wait_started(self, timeout: float = 120.0) -> None:
        """Until every running executor logged ``executor.started``."""
        deadline = time.monotonic() + timeout
        for proc, log in self.running:
            path = Path(log.name)
            while b"executor.started" not in path.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"an executor did not start: {path.read_text()[-2000:]}")
                time.sleep(0.1)

    def kill_one(self, rng: random.Random) -> bool:
        """SIGKILL one executor that has started claiming, and start its replacement; False
        (no kill) while fewer than all but one have started: under load a replacement takes
        seconds to start, and a kill loop faster than that would leave no executor at all."""
        started = [
            i
            for i, (_, log) in enumerate(self.running)
            if b"executor.started" in Path(log.name).read_bytes()
        ]
        if len(started) < max(1, len(self.running) - 1):
            return False
        proc, log = self.running.pop(rng.choice(started))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
        self.kills += 1
        self.start()
        return True

    def stop(self, timeout: float = 60.0) -> None:
        for proc, _ in self.running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc, log in self.running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        self.running.clear()

    def texts(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log"))}


def chaos_outbox() -> Outbox:
    """An outbox with the chaos kinds only (as the executors load them)."""
    return Outbox(host=build_host(use_entry_points=False, app_plugins=[PLUGIN]))


class Producer(threading.Thread):
    """Enqueues the run's actions in batches spread over ``enqueue_seconds``, into lanes that are
    running; a batch whose connection broke (a restart) is enqueued again (same keys: the same
    actions)."""

    def __init__(self, params: ChaosParams, url: str) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.params = params
        self.url = url
        self.error: BaseException | None = None
        self.retried = 0
        self.outbox = chaos_outbox()

    def requests(self) -> list[ActionRequest]:
        rng = random.Random(self.params.seed)
        p = self.params
        return [
            ActionRequest(
                kind=ONCE_KIND if rng.random() < p.once_share else READBACK_KIND,
                lane_key=f"lane-{i % p.lanes}",
                idempotency_key=f"chaos-{i}",
                payload={"seq": i // p.lanes + 1},
            )
            for i in range(p.actions)
        ]

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _produce(self) -> None:
        requests = self.requests()
        batches = [
            requests[i : i + self.params.batch] for i in range(0, len(requests), self.params.batch)
        ]
        began = time.monotonic()
        step = self.params.enqueue_seconds / max(1, len(batches))
        conn: psycopg.Connection[Any] | None = None
        for number, batch in enumerate(batches):
            time.sleep(max(0.0, began + number * step - time.monotonic()))
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.url, connect_timeout=5)
                    with conn.transaction():
                        self.outbox.enqueue_many(conn, batch)
                    break
                except psycopg.OperationalError:
                    self.retried += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
        if conn is not None:
            conn.close()


STUCK_SQL = """
WITH heads AS (
    SELECT DISTINCT ON (lane_key) id, lane_key, state, due_at, epoch, lease_until
      FROM outbox.agent_action WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
     ORDER BY lane_key, id
)
SELECT h.id, h.lane_key, h.state, h.epoch, round(extract(epoch FROM now() - h.due_at)::numeric, 1),
       round(extract(epoch FROM l.next_at - now())::numeric, 1), l.head_id, l.head_kind,
       (SELECT max(e.ended_at) FROM outbox.agent_action e
         WHERE e.lane_key = h.lane_key AND e.id < h.id) AS previous_ended
  FROM heads h LEFT JOIN outbox.action_lane l USING (lane_key)
 WHERE (h.state = 'ADMITTED' AND h.due_at < now() - interval '3 seconds'
        AND coalesce((SELECT max(e.ended_at) FROM outbox.agent_action e
                       WHERE e.lane_key = h.lane_key AND e.id < h.id), h.due_at)
            < now() - interval '3 seconds')
 ORDER BY h.due_at LIMIT 5
"""


class Monitor(threading.Thread):
    """Every second, the due heads that waited more than 3 s, with their lane rows (to
    ``monitor.log``: what to read when the worst wait of a due head is long)."""

    def __init__(self, url: str, path: Path) -> None:
        super().__init__(name="chaos-monitor", daemon=True)
        self.url = url
        self.path = path
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.path.open("a") as out:
            while not self.stopping.wait(1.0):
                try:
                    with psycopg.connect(self.url, connect_timeout=2) as conn:
                        rows = conn.execute(STUCK_SQL).fetchall()
                except psycopg.Error as exc:
                    out.write(f"{time.time():.1f} {type(exc).__name__}\n")
                    continue
                for row in rows:
                    out.write(f"{time.time():.1f} {row}\n")
                out.flush()


def executor_env(params: ChaosParams, url: str, provider_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
    env.update(
        OUTBOX_DATABASE_URL=url,
        OUTBOX_PLUGINS="",  # no installed plugin: the chaos kinds only
        OUTBOX_APP_PLUGINS=PLUGIN,
        OUTBOX_LEASE_SECONDS=str(params.lease_seconds),
        OUTBOX_FENCE_MARGIN_SECONDS=str(params.fence_margin_seconds),
        OUTBOX_CONCURRENCY=str(params.concurrency),
        OUTBOX_POLL_SECONDS="1",
        OUTBOX_MAINTENANCE_SECONDS="5",
        OUTBOX_SHUTDOWN_SECONDS="5",
        OUTBOX_STARTUP_WAIT_SECONDS="120",
        OUTBOX_CHAOS_PROVIDER_URL=f"http://127.0.0.1:{provider_port}",
        OUTBOX_CHAOS_CONNECT_TIMEOUT_SECONDS=str(min(1.0, params.fence_margin_seconds / 4)),
        OUTBOX_CHAOS_REQUEST_TIMEOUT_SECONDS=str(params.fence_margin_seconds / 2),
        PYTHONUNBUFFERED="1",
    )
    return env


def start_provider(
    params: ChaosParams, *extra: str, log: Path | None = None
) -> tuple[subprocess.Popen[str], int]:
    """The provider process and its port; its stderr goes to ``log`` (checked for tracebacks)."""
    stderr = log.open("w") if log is not None else None
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.chaos.provider",
            "--fail-rate",
            str(params.fail_rate),
            "--drop-rate",
            str(params.drop_rate),
            "--seed",
            str(params.seed),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    if stderr is not None:
        stderr.close()
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def provider_record(port: int, host: str = "127.0.0.1") -> list[Write]:
    with urllib.request.urlopen(f"http://{host}:{port}/record", timeout=60) as answer:
        return [Write(**w) for w in json.load(answer)["writes"]]


def migrate(env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "outbox"), "migrate"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"outbox migrate failed: {done.stdout}{done.stderr}")


def read_actions(url: str) -> list[ActionRow]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, kind, lane_key, idempotency_key, state, stop_reason, epoch,"
            " extract(epoch FROM created_at)::float8, extract(epoch FROM ended_at)::float8"
            " FROM outbox.agent_action ORDER BY id"
        ).fetchall()
    return [ActionRow(*row) for row in rows]


def live_actions(url: str) -> int | None:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM outbox.agent_action WHERE state NOT IN {ENDED_SQL}"
            ).fetchone()
            return int(row[0]) if row else None
    except psycopg.OperationalError:
        return None


LOG_EVENT = re.compile(r" (WARNING|ERROR) (outbox|psycopg\.pool) (\S+)")


def log_events(texts: Iterable[str]) -> dict[str, int]:
    """The executors' warnings and errors, counted by event name (``WARNING action.end.stale``;
    the pool's own lines by their first words)."""
    found: Counter[str] = Counter()
    for text in texts:
        for level, logger, name in LOG_EVENT.findall(text):
            found[f"{level} {name if logger == 'outbox' else 'psycopg.pool ' + name}"] += 1
    return dict(sorted(found.items()))


def _recoveries(cluster: ChaosCluster, actions: list[ActionRow]) -> list[dict[str, Any]]:
    ends = sorted(a.ended_at for a in actions if a.ended_at is not None)
    found = []
    for restart in cluster.restarts:
        after = next((t for t in ends if t > restart.up), None)
        found.append(
            {
                "mode": restart.mode,
                "down_seconds": round(restart.down_seconds, 2),
                "first_ending_after_seconds": (
                    round(after - restart.up, 2) if after is not None else None
                ),
            }
        )
    return found


def run_chaos(params: ChaosParams, logs: Path | None = None, *, say: Any = print) -> Report:
    """One run of ``params``; logs go to ``logs`` (a temporary folder by default, kept)."""
    logs = logs or Path(tempfile.mkdtemp(prefix="outbox-chaos-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(params.seed)
    started = began = time.monotonic()
    provider, port = start_provider(params, log=logs / "provider.log")
    try:
        with chaos_cluster() as cluster:
            durability = cluster.settings()
            env = executor_env(params, cluster.url, port)
            migrate(env)
            executors = Executors(env, logs)
            for _ in range(params.executors):
                executors.start()
            executors.wait_started()
            monitor = Monitor(cluster.url, logs / "monitor.log")
            monitor.start()
            producer = Producer(params, cluster.url)
            producer.start()
            began = time.monotonic()  # the schedule of kills and restarts runs from here
            modes = params.restart_modes
            restart_at = [
                params.enqueue_seconds * (i + 1) / (len(modes) + 1) for i in range(len(modes))
            ]
            next_kill = rng.uniform(params.kill_min_seconds, params.kill_max_seconds)
            try:
                while producer.is_alive() or modes or executors.kills < params.min_kills:
                    elapsed = time.monotonic() - began
                    if modes and elapsed >= restart_at[0]:
                        restart_at.pop(0)
                        done = cluster.restart(modes.pop(0))
                        say(
                            f"chaos: PostgreSQL restarted ({done.mode}) in {done.down_seconds:.1f} s"
                        )
                    if elapsed >= next_kill and executors.kill_one(rng):
                        next_kill = elapsed + rng.uniform(
                            params.kill_min_seconds, params.kill_max_seconds
                        )
                    time.sleep(0.05)
                if producer.error is not None:
                    raise RuntimeError("the producer failed") from producer.error
                say(f"chaos: {params.actions} actions enqueued, {executors.kills} kills; draining")
                deadline = time.monotonic() + params.drain_seconds
                while time.monotonic() < deadline:
                    if live_actions(cluster.url) == 0:
                        break
                    time.sleep(1.0)
            finally:
                monitor.stopping.set()
                executors.stop()
            actions = read_actions(cluster.url)
            restarts = _recoveries(cluster, actions)
        writes = provider_record(port)
    finally:
        provider.terminate()
        provider.wait(10)
    (logs / "writes.json").write_text(json.dumps([dataclasses.asdict(w) for w in writes]))
    (logs / "actions.json").write_text(json.dumps([dataclasses.asdict(a) for a in actions]))
    verdict = check(writes, actions, at_most_once=[ONCE_KIND], logs=executors.texts())
    verdict.figures["producer_retries"] = producer.retried
    verdict.figures["log_events"] = log_events(executors.texts().values())
    return Report(
        params=params,
        durability=durability,
        verdict=verdict,
        kills=executors.kills,
        executors_started=executors.started,
        restarts=restarts,
        seconds=time.monotonic() - started,
        logs=logs,
    )


def parse_params(argv: list[str] | None = None, base: ChaosParams | None = None) -> ChaosParams:
    """Parameters from ``CHAOS_<NAME>`` variables, then ``--<name>`` options, over ``base``."""
    base = base or ChaosParams()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(ChaosParams):
        kind = type(getattr(base, f.name))
        default = os.environ.get(f"CHAOS_{f.name.upper()}")
        values[f.name] = kind(default) if default is not None else getattr(base, f.name)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=values[f.name])
    parser.add_argument("--ci-size", action="store_true", help="the CI-sized run")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--logs", type=Path, help="the executors' logs go here")
    args = parser.parse_args(argv)
    if args.ci_size:
        return parse_params([a for a in (argv or []) if a != "--ci-size"], CI_SIZE)
    return ChaosParams(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ChaosParams)})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    params = parse_params(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path)
    known, _ = parser.parse_known_args(argv)
    report = run_chaos(params, known.logs)
    text = json.dumps(report.as_json(), indent=2)
    print(text)
    print(report.verdict.summary())
    print(f"executors' logs: {report.logs}")
    if known.json:
        known.json.write_text(text + "\n")
    sys.exit(0 if report.verdict.ok else 1)


if __name__ == "__main__":
    main()
