"""The chaos run's own PostgreSQL: a fresh cluster in a temporary folder on a free port, which the
run may restart at will (never the shared server). As root the server runs as the unprivileged
user of :mod:`outbox_core.embedded`, whose data folder must then be one it can reach: a fresh
folder directly under the temporary directory."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from outbox_core.embedded import EmbeddedPostgres

DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")


@dataclass(frozen=True)
class Restart:
    mode: str
    began: float  # time.time() before pg_ctl stop
    up: float  # when the restarted server accepted connections again

    @property
    def down_seconds(self) -> float:
        return self.up - self.began


class ChaosCluster:
    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self.restarts: list[Restart] = []

    @property
    def url(self) -> str:
        return self.server.url

    def settings(self) -> dict[str, str]:
        """The durability settings as the server reports them (all must be ``on``)."""
        found: dict[str, str] = {}
        with psycopg.connect(self.url) as conn:
            for name in DURABILITY:
                row = conn.execute(f"SHOW {name}").fetchone()
                found[name] = str(row[0]) if row else "?"
        return found

    def restart(self, mode: str) -> Restart:
        began = time.time()
        self.server.restart(mode)
        done = Restart(mode, began, time.time())
        self.restarts.append(done)
        return done


@contextmanager
def chaos_cluster(log: bool = False) -> Iterator[ChaosCluster]:
    folder = Path(tempfile.mkdtemp(prefix="outbox-chaos-pg-"))
    server = EmbeddedPostgres(folder, log=print if log else (lambda _: None))
    try:
        server.start()
        cluster = ChaosCluster(server)
        found = cluster.settings()
        if any(value != "on" for value in found.values()):
            raise RuntimeError(f"the chaos cluster must run with durability on: {found}")
        yield cluster
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
