"""A primary that fails over (issue 35): a pg_auto_failover formation of a monitor, a primary
and a secondary on this machine, from Debian's ``postgresql-15-auto-failover`` (``.ci/run``
installs it). Three ports chosen free at start, three data folders in one temporary folder,
every server on 127.0.0.1 only; never the shared server. As root, every process of the
formation runs as the unprivileged user of :mod:`outbox_core.embedded` (``outbox-pg``), which
owns only that folder.

The formation's replication:

* ``sync``: pg_auto_failover's default for one standby, ``number_sync_standbys = 0`` with the
  standby in the replication quorum, which sets ``synchronous_standby_names = 'ANY 1
  (<standby>)'``: a commit returns once the standby has it. (pg_auto_failover refuses
  ``number_sync_standbys = 1`` with one standby: it needs that many standbys plus one. While
  no standby is healthy, the primary is ``wait_primary`` and commits without one.)
* ``async``: both nodes out of the quorum (``replication-quorum false``), so
  ``synchronous_standby_names = ''``: a commit returns before the standby has it.

What the chaos run does to it (:meth:`FailoverCluster.perform_failover`,
:meth:`~FailoverCluster.kill_primary`, :meth:`~FailoverCluster.rejoin`): a planned failover
(``pg_autoctl perform failover``); an unplanned one, SIGKILL of the primary's postmaster and
of its ``pg_autoctl`` keeper at once (a keeper left alive would restart its postmaster: a
restart, not a failover), as when its host dies; and the killed node started again, which
rewinds and rejoins as the standby. The monitor notices a dead primary sooner than by default
(its health checks every second, a node unhealthy after 3 s, a demotion waited for 5 s): the
figures depend on those settings (docs/reliability.md).

A node can run with its clock shifted (``skew``: seconds ahead), through Debian's libfaketime
(``faketime``) preloaded into its keeper and so into its postmaster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import psycopg

from outbox_core.embedded import SERVER_USER, _Account, _create_account, _lookup_account

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
PACKAGES = {"pg_autoctl": "postgresql-15-auto-failover", "libfaketime": "faketime"}
HOST = "127.0.0.1"
DBNAME = "outbox"
Replication = Literal["sync", "async"]
# The monitor's health checks, faster than pg_auto_failover's defaults (5 s, 20 s, 30 s).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "3000",
    "pgautofailover.primary_demote_timeout": "5000",
}
PRIMARY_STATES = ("single", "primary", "wait_primary")


def missing(*, skew: bool = False) -> str | None:
    """What this machine lacks to build the formation (``None``: nothing), in one line."""
    needed = [("pg_autoctl", PG_AUTOCTL), ("postgres", PG_BIN / "postgres")]
    if skew:
        needed.append(("libfaketime", FAKETIME))
    for name, path in needed:
        if not path.exists():
            package = PACKAGES.get(name, "postgresql-15")
            return f"{path} is missing: apt-get install -y {package} (.ci/run installs it)"
    return None


def _answers(url: str, query: str) -> bool:
    """Whether ``url`` takes a connection and answers ``query`` (within a couple of seconds)."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute(query)
        return True
    except psycopg.Error:
        return False


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class Failover:
    mode: str  # "perform" (pg_autoctl perform failover) or "kill" (SIGKILL of the primary)
    old: str  # the node that was primary, and the one that is now
    new: str
    began: float  # time.time() when it was asked for (or the primary killed)
    up: float  # when the monitor had the new primary, and it accepted a read-write connection
    # What a watcher polling each node every 50 ms saw: the old primary's last read-write
    # connection, and the new one's first (each within a poll of the truth).
    old_last_write: float = 0.0
    new_first_write: float = 0.0

    @property
    def down_seconds(self) -> float:
        return self.up - self.began


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    skew: float = 0.0
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None


@dataclass
class FailoverCluster:
    folder: Path
    replication: Replication
    account: _Account | None
    monitor: Node
    nodes: list[Node]
    failovers: list[Failover] = field(default_factory=list)
    rejoins: list[dict[str, Any]] = field(default_factory=list)

    # -- addresses -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The multi-host URL of the executors and the producer: the node that is read-write."""
        hosts = ",".join(f"{HOST}:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{DBNAME}?target_session_attrs=read-write"

    def node_url(self, node: Node, dbname: str = DBNAME) -> str:
        return f"postgresql://postgres@{HOST}:{node.port}/{dbname}"

    def database(self, name: str) -> str:
        """A new database on the formation (replicated as any write); its multi-host URL."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.replace(f"/{DBNAME}?", f"/{name}?")

    def healthy(self) -> None:
        """Until one node is primary and the other its standby (after a test's failovers)."""

        def settled() -> bool:
            states = {reported for reported, goal in self.states().values() if reported == goal}
            return states == {"primary", "secondary"}

        self.wait_for(settled, "primary and secondary")

    @property
    def monitor_url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.monitor.port}/pg_auto_failover"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    # -- processes -------------------------------------------------------------------------

    def _env(self, node: Node | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "XDG_"))}
        env.update(
            PATH=f"{PG_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            PG_CONFIG=str(PG_BIN / "pg_config"),
            PGHOST=str(self.folder / "sock"),  # pg_autoctl's own local connections
            PGUSER="postgres",
            XDG_CONFIG_HOME=str(self.folder / "config"),
            XDG_DATA_HOME=str(self.folder / "share"),
            XDG_RUNTIME_DIR=str(self.folder / "run"),
            LC_MESSAGES="C",
        )
        if node is not None and node.skew:
            env.update(
                LD_PRELOAD=str(FAKETIME),
                FAKETIME=f"{node.skew:+g}",
                DONT_FAKE_MONOTONIC="1",
            )
        return env

    def _user(self) -> dict[str, Any]:
        a = self.account
        return {"user": a.uid, "group": a.gid, "extra_groups": []} if a is not None else {}

    def _run(self, *argv: str, node: Node | None = None, timeout: float = 180.0) -> str:
        done = subprocess.run(
            argv,
            cwd=self.folder,
            env=self._env(node),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            encoding="utf-8",
            errors="replace",  # pg_autoctl's tables are not always UTF-8
            timeout=timeout,
            check=False,
            **self._user(),
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv[:3])} failed (exit {done.returncode}):\n"
                f"{(done.stderr or done.stdout)[-3000:]}"
            )
        return done.stdout

    def _initdb(self, node: Node, settings: Mapping[str, str] = {}) -> None:
        self._run(
            str(PG_BIN / "initdb"), "-D", str(node.pgdata), "-U", "postgres", "-A", "trust",
            "--no-instructions", node=node,
        )  # fmt: skip
        lines = [f"unix_socket_directories = '{self.folder / 'sock'}'"]
        lines += [f"{name} = '{value}'" for name, value in settings.items()]
        with (node.pgdata / "postgresql.auto.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")

    def start(self, node: Node) -> None:
        """``pg_autoctl run`` for ``node``, in a process group of its own (killed as one)."""
        node.log = (self.folder / f"{node.name}.log").open("ab")
        node.proc = subprocess.Popen(
            [str(PG_AUTOCTL), "run", "--pgdata", str(node.pgdata)],
            cwd=self.folder,
            env=self._env(node),
            stdin=subprocess.DEVNULL,
            stdout=node.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._user(),
        )

    def _create_node(self, node: Node) -> None:
        self._run(
            str(PG_AUTOCTL), "create", "postgres", "--pgdata", str(node.pgdata),
            "--pgport", str(node.port), "--hostname", HOST, "--listen", HOST,
            "--auth", "trust", "--no-ssl", "--name", node.name, "--dbname", DBNAME,
            "--monitor", f"postgres://autoctl_node@{HOST}:{self.monitor.port}/pg_auto_failover",
            node=node,
        )  # fmt: skip
        self.start(node)

    def build(self) -> None:
        for sub in ("sock", "config", "share", "run"):
            (self.folder / sub).mkdir(mode=0o700)
        if self.account is not None:
            for path in (
                self.folder,
                *(self.folder / s for s in ("sock", "config", "share", "run")),
            ):
                os.chown(path, self.account.uid, self.account.gid)
        self._initdb(self.monitor, MONITOR_SETTINGS)
        self._run(
            str(PG_AUTOCTL), "create", "monitor", "--pgdata", str(self.monitor.pgdata),
            "--pgport", str(self.monitor.port), "--hostname", HOST, "--listen", HOST,
            "--auth", "trust", "--no-ssl",
        )  # fmt: skip
        self.start(self.monitor)
        self.wait_for(lambda: self._monitor_answers(), "the monitor to answer")
        first, second = self.nodes
        self._initdb(first)  # the standby is a base backup of it, socket folder included
        self._create_node(first)
        self.wait_for(lambda: self.states().get(first.name) == ("single", "single"), "a primary")
        self._create_node(second)
        self.wait_states({first.name: "primary", second.name: "secondary"})
        if self.replication == "async":
            for node in self.nodes:
                self._run(
                    str(PG_AUTOCTL), "set", "node", "replication-quorum", "false",
                    "--pgdata", str(node.pgdata), node=node,
                )  # fmt: skip
            self.wait_for(lambda: self.standby_names() == "", "asynchronous replication")
        else:
            self.wait_for(lambda: self.standby_names().startswith("ANY 1"), "a sync standby")

    def stop(self) -> None:
        for node in [*self.nodes, self.monitor]:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in [*self.nodes, self.monitor]:
            if node.proc is not None:
                try:
                    node.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self._kill_group(node)
            self._kill_postmaster(node)
            if node.log is not None:
                node.log.close()

    # -- what the monitor says -------------------------------------------------------------

    def _monitor_answers(self) -> bool:
        return _answers(self.monitor_url, "SELECT 1 FROM pgautofailover.node LIMIT 1")

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's reported and assigned state, as the monitor has them."""
        with psycopg.connect(self.monitor_url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
            ).fetchall()
        return {str(name): (str(reported), str(goal)) for name, reported, goal in rows}

    def wait_states(self, wanted: Mapping[str, str], timeout: float = 180.0) -> None:
        self.wait_for(
            lambda: all(self.states().get(n) == (s, s) for n, s in wanted.items()),
            f"the states {dict(wanted)}",
            timeout,
        )

    def primary(self) -> Node:
        """The node the monitor has as primary (reported and assigned)."""
        found = self._primary()
        if found is None:
            raise RuntimeError(f"the failover formation has no primary: {self.states()}")
        return found

    def _primary(self) -> Node | None:
        states = self.states()
        for node in self.nodes:
            reported, goal = states.get(node.name, ("", ""))
            if reported == goal and reported in PRIMARY_STATES:
                return node
        return None

    def standby_names(self) -> str:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
        return str(row[0]) if row else "?"

    def settings(self) -> dict[str, str]:
        """The durability settings of the primary (all must be on) and its standby names."""
        found: dict[str, str] = {}
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            for name in ("fsync", "synchronous_commit", "full_page_writes"):
                row = conn.execute(f"SHOW {name}").fetchone()
                found[name] = str(row[0]) if row else "?"
        found["synchronous_standby_names"] = self.standby_names()
        return found

    def writable(self) -> bool:
        return _answers(self.url, "SELECT 1")

    @staticmethod
    def wait_for(test: Any, what: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if test():
                    return
            except psycopg.Error:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the failover formation: no {what} within {timeout:.0f} s")
            time.sleep(0.1)

    # -- what the chaos run does to it -----------------------------------------------------

    def _new_primary(self, mode: str, old: Node, began: float, watch: _Writes) -> Failover:
        def moved() -> bool:
            new = self._primary()
            return new is not None and new.name != old.name and self.writable()

        self.wait_for(moved, f"new primary after the {mode} failover")
        up = time.time()
        new = self.primary()
        seen = watch.stop()
        old_last = max((t for t in seen.get(old.name, []) if t <= up), default=began)
        new_first = min((t for t in seen.get(new.name, []) if t > old_last), default=up)
        done = Failover(mode, old.name, new.name, began, up, old_last, new_first)
        self.failovers.append(done)
        return done

    def perform_failover(self) -> Failover:
        """``pg_autoctl perform failover``: the planned kind (the primary drains and becomes
        the standby)."""
        old = self.primary()
        watch = _Writes(self)
        began = time.time()
        self._run(str(PG_AUTOCTL), "perform", "failover", "--pgdata", str(self.monitor.pgdata))
        return self._new_primary("perform", old, began, watch)

    def kill_primary(self, lag_seconds: float = 0.0) -> Failover:
        """SIGKILL of the primary's postmaster and of its keeper, at once; until the monitor
        promotes the standby. With ``lag_seconds``, the primary's WAL sender is stopped
        (SIGSTOP) that long before the kill, and dies with it: a standby that lags, as over a
        network that stalls (stopping the standby's receiver would not do: what the sender
        wrote before waits in the socket and arrives after all). Synchronous commits wait
        meanwhile, and fail with the primary; asynchronous ones return, and are lost with it."""
        old = self.primary()
        watch = _Writes(self)
        sender = self._wal_sender(old) if lag_seconds > 0 else None
        if sender is not None:
            os.kill(sender, signal.SIGSTOP)
            time.sleep(lag_seconds)  # the stall itself, not a wait for a condition
        began = time.time()
        self._kill_group(old)
        self._kill_postmaster(old)
        if sender is not None:
            with suppress(ProcessLookupError):
                os.kill(sender, signal.SIGKILL)  # a stopped process would outlive its postmaster
        if old.proc is not None:
            old.proc.wait()
        return self._new_primary("kill", old, began, watch)

    def _wal_sender(self, primary: Node) -> int:
        with psycopg.connect(self.node_url(primary), connect_timeout=5) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_replication LIMIT 1").fetchone()
        if row is None:
            raise RuntimeError(f"{primary.name} has no WAL sender to stall")
        return int(row[0])

    def rejoin(self, name: str) -> dict[str, Any]:
        """Start a killed node again: it rewinds and follows the new primary as its standby."""
        node = self.node(name)
        began = time.time()
        self.start(node)
        self.wait_states({node.name: "secondary", self.primary().name: "primary"})
        done = {"node": name, "seconds": round(time.time() - began, 2)}
        self.rejoins.append(done)
        return done

    def clock_offset(self, node: Node) -> float:
        """The node's database clock minus this process's clock, in seconds."""
        with psycopg.connect(self.node_url(node), connect_timeout=5) as conn:
            before = time.time()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            after = time.time()
        assert row is not None
        return float(row[0]) - (before + after) / 2

    def _kill_group(self, node: Node) -> None:
        if node.proc is not None and node.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)

    def _kill_postmaster(self, node: Node) -> None:
        try:
            pid = int((node.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class _Writes(threading.Thread):
    """Polls every node for a read-write connection every 50 ms, noting when each took one:
    when the old primary stopped taking writes and the new one began (the monitor learns it
    later, from the keepers' reports)."""

    def __init__(self, cluster: FailoverCluster) -> None:
        super().__init__(name="failover-writes", daemon=True)
        self.urls = {
            n.name: cluster.node_url(n) + "?target_session_attrs=read-write" for n in cluster.nodes
        }
        self.seen: dict[str, list[float]] = {name: [] for name in self.urls}
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopping.is_set():
            for name, url in self.urls.items():
                try:
                    with psycopg.connect(url, connect_timeout=1):
                        self.seen[name].append(time.time())
                except psycopg.Error:
                    pass
            self.stopping.wait(0.05)

    def stop(self) -> dict[str, list[float]]:
        self.stopping.set()
        self.join(10)
        return self.seen


@contextmanager
def failover_cluster(
    replication: Replication = "sync", *, skew: Mapping[str, float] = {}
) -> Iterator[FailoverCluster]:
    """A running formation (``node1`` the primary, ``node2`` its standby), stopped and removed
    at the end; ``skew`` shifts named nodes' clocks (seconds ahead)."""
    reason = missing(skew=bool(skew))
    if reason is not None:
        raise RuntimeError(reason)
    folder = Path(tempfile.mkdtemp(prefix="outbox-failover-"))
    account = None
    if os.geteuid() == 0:
        account = _lookup_account(SERVER_USER) or _create_account(SERVER_USER)
    ports = _free_ports(3)
    monitor = Node("monitor", ports[0], folder / "monitor")
    nodes = [
        Node(name, port, folder / name, skew.get(name, 0.0))
        for name, port in zip(("node1", "node2"), ports[1:], strict=True)
    ]
    cluster = FailoverCluster(folder, replication, account, monitor, nodes)
    try:
        cluster.build()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
