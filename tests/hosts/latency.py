"""Start latency and burn-down of executors on hosts (namespaces), with an added round trip
between them and their database (the delay line of :mod:`.relay`), and the database's CPU per
action: the figures of docs/reliability.md ("Executors on several hosts") and docs/scaling.md.

- **Start latency**: every executor idle and waiting, one action enqueued at a time; from the
  producer's commit to the provider's receipt of its write (one clock: the same machine).
- **Burn-down**: ``burn`` actions in ``lanes`` lanes committed at once while the executors
  wait; their count over the time from the enqueue's ``now()`` to the last ``ended_at`` (the
  database's clock), and the CPU the database's processes spent meanwhile (``/proc``).

``python -m tests.hosts.latency`` (as root, from the repository's root) runs the sizes of the
docs and prints one JSON object per configuration; ``test_latency.py`` runs a small size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psycopg

from outbox_core import ActionRequest

from ..chaos.plugin import READBACK_KIND
from ..chaos.run import CI_SIZE, ChaosParams, chaos_outbox
from ..chaos.test_sigstop import until
from .rig import Rig, relay, rig

PARAMS = replace(CI_SIZE, concurrency=100, fail_rate=0.0, drop_rate=0.0)
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Figures:
    hosts: int
    delay_ms: float
    via: str  # "direct" or "relay"
    start_p50_ms: float
    start_p90_ms: float
    start_max_ms: float
    burn_actions: int
    burn_seconds: float
    burn_per_second: float
    server_cpu_ms_per_action: float


def server_cpu_seconds(postmaster: int) -> float:
    """User and system CPU of the postmaster and its children (the backends), from /proc."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(fields[1])
        if pid == postmaster or ppid == postmaster:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def _waiting(r: Rig, hosts: int) -> bool:
    return int(r.scalar("SELECT count(*) FROM outbox.executor_waiting")) >= hosts


def _start_latencies(r: Rig, hosts: int, samples: int, tag: str) -> list[float]:
    outbox = chaos_outbox()
    committed: dict[str, float] = {}
    with psycopg.connect(r.url, autocommit=False) as conn:
        for i in range(samples):
            until("every executor waiting", lambda: _waiting(r, hosts))
            key = f"{tag}-start-{i}"
            outbox.enqueue(
                conn, ActionRequest(READBACK_KIND, f"lane-{key}", key, payload={"seq": 1})
            )
            conn.commit()
            committed[key] = time.time()
            written = f"/effects?key={key}&epoch=0"
            until(f"the write of {key}", lambda: r.provider(written)["effects"])  # noqa: B023
    first = {}
    for w in r.writes():
        if w.key in committed and w.key not in first:
            first[w.key] = w.t_start
    return [(first[key] - at) * 1000 for key, at in committed.items()]


def _burn(r: Rig, actions: int, lanes: int, tag: str) -> tuple[float, float]:
    """(seconds, server CPU seconds) of a burn-down of ``actions`` in ``lanes`` lanes."""
    requests = [
        ActionRequest(
            READBACK_KIND,
            f"{tag}-lane-{i % lanes}",
            f"{tag}-burn-{i}",
            payload={"seq": i // lanes + 1},
        )
        for i in range(actions)
    ]
    postmaster = r.db.postmaster_pid()
    before = server_cpu_seconds(postmaster)
    with psycopg.connect(r.url) as conn:
        chaos_outbox().enqueue_many(conn, requests)
        conn.commit()
    pattern = f"{tag}-burn-%"
    live = (
        "SELECT count(*) FROM outbox.agent_action WHERE idempotency_key LIKE %s"
        " AND state NOT IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')"
    )
    until("the burn-down", lambda: r.scalar(live, (pattern,)) == 0)
    used = server_cpu_seconds(postmaster) - before
    seconds = float(
        r.scalar(
            "SELECT extract(epoch FROM max(ended_at) - min(created_at))"
            " FROM outbox.agent_action WHERE idempotency_key LIKE %s",
            (pattern,),
        )
    )
    return seconds, used


def measure(
    r: Rig, *, hosts: int, delay_ms: float, via: str, samples: int, burn: int, lanes: int
) -> Figures:
    """Start ``hosts`` executors (through the delay line unless ``via == "direct"``), measure,
    stop them."""
    tag = f"h{hosts}-{via}-{delay_ms:g}"

    def run(port: int | None) -> Figures:
        started = [r.start(host, port=port) for host in r.net.hosts[:hosts]]
        r.wait_started(*started)
        try:
            starts = _start_latencies(r, hosts, samples, tag)
            seconds, cpu = _burn(r, burn, lanes, tag)
        finally:
            for executor in started:
                executor.stop()
        return Figures(
            hosts=hosts,
            delay_ms=delay_ms,
            via=via,
            start_p50_ms=round(statistics.median(starts), 1),
            start_p90_ms=round(statistics.quantiles(starts, n=10)[-1], 1),
            start_max_ms=round(max(starts), 1),
            burn_actions=burn,
            burn_seconds=round(seconds, 2),
            burn_per_second=round(burn / seconds, 1),
            server_cpu_ms_per_action=round(cpu * 1000 / burn, 3),
        )

    if via == "direct":
        return run(None)
    with relay(r, delay_ms) as port:
        return run(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.hosts.latency", description=__doc__)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--burn", type=int, default=6000)
    parser.add_argument("--lanes", type=int, default=600)
    args = parser.parse_args(argv)
    params: ChaosParams = PARAMS
    sizes = {"samples": args.samples, "burn": args.burn, "lanes": args.lanes}
    runs = [(n, 0.0, "direct") for n in (1, 2, 4)]
    runs += [(3, 0.0, "direct"), (3, 0.0, "relay"), (3, 2.0, "relay"), (3, 20.0, "relay")]
    with rig(4, params, Path(tempfile.mkdtemp(prefix="outbox-hosts-logs-"))) as r:
        for hosts, delay, via in runs:
            figures = measure(r, hosts=hosts, delay_ms=delay, via=via, **sizes)
            print(json.dumps(asdict(figures)), flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
