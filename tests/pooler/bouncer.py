"""A PgBouncer of the test's own: Debian's ``pgbouncer`` (1.18 on bookworm; ``.ci/run``
installs it) with a fresh configuration in a temporary folder, on a free port of 127.0.0.1, in
one pool mode, in front of the tests' PostgreSQL (every database name passes through to it).
PgBouncer refuses to run as root: as root it runs as the system user ``postgres``."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

RUN_AS = "postgres"  # PgBouncer's own refusal: "PgBouncer should not run as root"
READY_SECONDS = 30.0
BIND_ATTEMPTS = 5


@dataclass(frozen=True)
class Bouncer:
    mode: str
    port: int
    folder: Path

    def url(self, server_url: str) -> str:
        """``server_url`` (a database of the server behind it) through this PgBouncer: the same
        database and user, no password (PgBouncer logs in to the server itself)."""
        params = conninfo_to_dict(server_url)
        params.pop("password", None)
        return make_conninfo(
            "", **{**params, "host": "127.0.0.1", "port": str(self.port), "sslmode": "disable"}
        )

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config(folder: Path, server_url: str, mode: str, port: int, pool_size: int) -> str:
    server = conninfo_to_dict(server_url)
    target = {
        "host": server.get("host") or "127.0.0.1",
        "port": server.get("port") or "5432",
        "user": server.get("user") or "postgres",
    }
    if server.get("password"):
        target["password"] = str(server["password"])
    line = " ".join(f"{key}={value}" for key, value in target.items())
    return f"""\
[databases]
* = {line}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 200
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def pgbouncer(server_url: str, mode: str, *, pool_size: int = 4) -> Iterator[Bouncer]:
    """A PgBouncer in ``mode`` (``transaction`` or ``session``) in front of the server of
    ``server_url``, stopped and removed at the end."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError(
            "pgbouncer is not installed: apt-get install pgbouncer (.ci/run installs it)"
        )
    folder = Path(tempfile.mkdtemp(prefix=f"outbox-pgbouncer-{mode}-"))
    user = conninfo_to_dict(server_url).get("user") or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    as_root = os.geteuid() == 0
    if as_root:
        account = pwd.getpwnam(RUN_AS)
        os.chown(folder, account.pw_uid, account.pw_gid)
        for path in folder.iterdir():
            os.chown(path, account.pw_uid, account.pw_gid)
    proc: subprocess.Popen[bytes] | None = None
    try:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            port = _free_port()
            config = folder / "pgbouncer.ini"
            config.write_text(_config(folder, server_url, mode, port, pool_size))
            if as_root:
                os.chown(config, pwd.getpwnam(RUN_AS).pw_uid, -1)
            argv = [binary, str(config)]
            if as_root:
                argv = ["runuser", "-u", RUN_AS, "--", *argv]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + READY_SECONDS
            while proc.poll() is None and not _accepts(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen within {READY_SECONDS:.0f} s")
                time.sleep(0.05)
            if proc.poll() is None:
                yield Bouncer(mode, port, folder)
                return
            log = Bouncer(mode, port, folder).log()
            if "Address already in use" not in log or attempt == BIND_ATTEMPTS:
                raise RuntimeError(f"pgbouncer exited ({proc.returncode}):\n{log[-2000:]}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
