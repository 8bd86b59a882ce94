"""What a hosts test runs: the network (:mod:`.network`), the database in the root namespace
(:mod:`.cluster`), the chaos run's provider on the network's root address, and one ``outbox
run`` per host inside its namespace, with the chaos kinds (tests/chaos/plugin.py), reaching the
database directly or through the delay line (:mod:`.relay`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from ..chaos.provider import Write
from ..chaos.run import ROOT, ChaosParams, executor_env, migrate, provider_record, start_provider
from ..chaos.test_sigstop import until
from .cluster import Cluster, cluster
from .network import Host, Network, network

OUTBOX = str(Path(sys.executable).parent / "outbox")


@dataclass
class HostExecutor:
    """One ``outbox run`` inside a host's namespace (``ip netns exec`` execs it: same pid)."""

    host: Host
    proc: subprocess.Popen[bytes]
    log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return Path(self.log_file.name).read_text(errors="replace")

    def started(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the executor on {self.host.name} exited: {self.log()[-2000:]}")
        return "executor.started" in self.log()

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


@dataclass
class Rig:
    net: Network
    db: Cluster
    params: ChaosParams
    provider_port: int
    logs: Path
    executors: list[HostExecutor] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The database from the root namespace (the producer, the checks)."""
        return self.db.url()

    def provider(self, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"http://{self.net.address}:{self.provider_port}{path}"
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=30) as r:
            return json.load(r)

    def writes(self) -> list[Write]:
        return provider_record(self.provider_port, self.net.address)

    def start(self, host: Host, *, port: int | None = None, **settings: str) -> HostExecutor:
        """``outbox run`` on ``host``, reaching the database on the network's root address (on
        ``port``: the delay line's; the database's by default)."""
        url = self.db.url(self.net.address)
        if port is not None:
            url = url.replace(f":{self.db.port}/", f":{port}/")
        env = executor_env(self.params, url, self.provider_port)
        env["OUTBOX_CHAOS_PROVIDER_URL"] = f"http://{self.net.address}:{self.provider_port}"
        env.update(settings)
        log = (self.logs / f"{host.name}-{len(self.executors) + 1}.log").open("wb")
        proc = subprocess.Popen(
            host.command(OUTBOX, "run"),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        executor = HostExecutor(host, proc, log)
        self.executors.append(executor)
        return executor

    def wait_started(self, *executors: HostExecutor) -> None:
        for executor in executors:
            until(f"the executor on {executor.host.name} to start", executor.started)

    def stop_all(self) -> None:
        for executor in self.executors:
            executor.stop()

    def scalar(self, query: str, params: Any = None) -> Any:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(query, params).fetchone()
        return row[0] if row else None


@contextmanager
def relay(rig: Rig, delay_ms: float) -> Iterator[int]:
    """The delay line on the network's root address, in front of the database: its port."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.hosts.relay",
            "--listen",
            rig.net.address,
            "--target-port",
            str(rig.db.port),
            "--delay-ms",
            str(delay_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def rig(hosts: int, params: ChaosParams, logs: Path) -> Iterator[Rig]:
    """``hosts`` namespaces, their database and the provider; every executor started on them is
    stopped, and the namespaces removed, at the end."""
    with ExitStack() as stack:
        net = stack.enter_context(network(hosts))
        db = stack.enter_context(cluster(net.address, net.cidr))
        provider, port = start_provider(params, "--host", net.address, log=logs / "provider.log")

        def stop_provider() -> None:
            provider.terminate()
            provider.wait(10)

        stack.callback(stop_provider)
        made = Rig(net, db, params, port, logs)
        stack.callback(made.stop_all)
        migrate(executor_env(params, made.url, port))
        yield made
