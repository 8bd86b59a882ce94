"""`outbox quickstart` leaves nothing it did not say it would: with a database configured it
asks first and runs in a scratch schema it drops; each run starts its demo file afresh; and
`--clean` removes what it made (the embedded server's folder, the demo file, and as root the
system user it created)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from outbox_core import embedded
from outbox_core.cli import main
from outbox_core.quickstart import HEADER


def _schemas(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace")}


def test_with_a_database_configured_it_asks_first_and_writes_nothing(
    unmigrated_url: str, tmp_path: Path
) -> None:
    before = _schemas(unmigrated_url)
    lines = tmp_path / "lines.txt"
    result = CliRunner().invoke(
        main, ["quickstart", "--file", str(lines)], env={"OUTBOX_DATABASE_URL": unmigrated_url}
    )
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith("outbox: error: a database is configured (")
    assert "pass --yes to go ahead" in line and "unset OUTBOX_DATABASE_URL" in line
    assert _schemas(unmigrated_url) == before
    assert not lines.exists()


def test_with_yes_it_runs_in_a_scratch_schema_that_it_drops(
    unmigrated_url: str, tmp_path: Path
) -> None:
    before = _schemas(unmigrated_url)
    lines = tmp_path / "lines.txt"
    args = ["quickstart", "--yes", "--count", "6", "--lanes", "2", "--file", str(lines)]
    for _ in range(2):  # a second run starts the file afresh
        result = CliRunner().invoke(main, args, env={"OUTBOX_DATABASE_URL": unmigrated_url})
        assert result.exit_code == 0, result.output
        assert "all 6 demo actions ended DONE" in result.output
        assert "dropped the scratch schema outbox_quickstart_" in result.output
        assert _schemas(unmigrated_url) == before
        header, *written = lines.read_text().splitlines()
        assert header.startswith(f"{HEADER} run ")
        assert sorted(written) == sorted(f"lane {i % 2}: action {i // 2 + 1}" for i in range(6))


def test_a_file_it_did_not_write_is_refused_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "SERVER_USER", f"outbox-t{uuid.uuid4().hex[:8]}")
    mine = tmp_path / "notes.txt"
    mine.write_text("my own notes\n")
    for args in (
        ["quickstart", "--file", str(mine)],
        ["quickstart", "--clean", "--file", str(mine)],
    ):
        result = CliRunner().invoke(
            main, [*args, "--data-dir", str(tmp_path / "pg")], env={"OUTBOX_DATABASE_URL": ""}
        )
        if "--clean" in args:  # nothing of the quickstart's: nothing removed
            assert result.exit_code == 0, result.output
            assert result.output.splitlines() == ["nothing to remove"]
        else:
            assert result.exit_code == 2, result.output
            assert "was not written by outbox quickstart; pass another --file" in result.output
    assert mine.read_text() == "my own notes\n"


@pytest.mark.slow
def test_clean_removes_the_embedded_folder_the_demo_file_and_the_user_it_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A system user of this test's own: the servers of other tests run as outbox-pg.
    user = f"outbox-t{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(embedded, "SERVER_USER", user)
    # Not tmp_path: as root the server user must be able to traverse the folder (see
    # test_embedded.py).
    world = Path(tempfile.mkdtemp(prefix="outbox-quickstart-clean-", dir="/tmp"))
    world.chmod(0o755)
    data, lines = world / "pg", world / "lines.txt"
    where = ["--data-dir", str(data), "--file", str(lines)]
    env = {"OUTBOX_DATABASE_URL": ""}
    try:
        result = CliRunner().invoke(main, ["quickstart", "--count", "3", *where], env=env)
        assert result.exit_code == 0, result.output
        assert (data / "pgdata" / "PG_VERSION").is_file() and lines.is_file()
        as_root = embedded._running_as_root()
        if as_root:
            assert pwd.getpwnam(user).pw_gecos == "outbox embedded PostgreSQL"
        result = CliRunner().invoke(main, ["quickstart", "--clean", *where], env=env)
        assert result.exit_code == 0, result.output
        expected = [f"removed the data folder {data.resolve()}"]
        if as_root:
            expected.append(f"removed the system user {user!r} (and its group)")
        expected.append(f"removed the demo file {lines}")
        assert result.output.splitlines() == expected
        assert not data.exists() and not lines.exists()
        if as_root:
            with pytest.raises(KeyError):
                pwd.getpwnam(user)
        again = CliRunner().invoke(main, ["quickstart", "--clean", *where], env=env)
        assert again.output.splitlines() == ["nothing to remove"]
    finally:
        subprocess.run(["userdel", user], capture_output=True, check=False)
        shutil.rmtree(world, ignore_errors=True)
