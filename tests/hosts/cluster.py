"""The hosts' database: a PostgreSQL cluster of the test's own (Debian's server binaries, the
version the machine runs), in a temporary folder, on a free port, listening on 127.0.0.1 and on
the test network's root address, trusting that network's hosts. Never the shared server. As
root it runs as the system user ``postgres``; the durability settings are left on."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RUN_AS = "postgres"


@dataclass(frozen=True)
class Cluster:
    port: int
    folder: Path

    def url(self, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/postgres"

    def postmaster_pid(self) -> int:
        return int((self.folder / "data" / "postmaster.pid").read_text().split()[0])


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server(program: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a server program, as the user ``postgres`` when this process is root."""
    argv = [str(program), *args]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", RUN_AS, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@contextmanager
def cluster(listen: str, network: str, *, max_connections: int = 200) -> Iterator[Cluster]:
    """A cluster listening on 127.0.0.1 and ``listen``, trusting ``network`` (a CIDR)."""
    bindir = _bindir()
    folder = Path(tempfile.mkdtemp(prefix="outbox-hosts-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        account = pwd.getpwnam(RUN_AS)
        os.chown(folder, account.pw_uid, account.pw_gid)
    started = False
    try:
        initdb = ["-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"]
        done = _server(bindir / "initdb", *initdb, "--no-instructions")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {network} trust\n")
        port = _free_port()
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1,{listen}'\nport = {port}\n"
                f"unix_socket_directories = ''\nmax_connections = {max_connections}\n"
            )
        log = folder / "server.log"
        done = _server(
            bindir / "pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "120", "start"
        )
        if done.returncode != 0:
            text = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the hosts' PostgreSQL did not start: {text}")
        started = True
        yield Cluster(port, folder)
    finally:
        if started:
            _server(bindir / "pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
