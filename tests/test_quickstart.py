"""The README's quickstart, as a new user runs it: a clean virtual environment, no database
configured, the embedded server started and stopped by `outbox quickstart`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def world() -> Iterator[Path]:
    # Not pytest's tmp_path: as root the embedded server runs as an unprivileged user, who must
    # be able to reach the virtual environment's binaries and the data folder.
    base = Path(tempfile.mkdtemp(prefix="outbox-quickstart-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def postmasters_of(data: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True, check=False)
    return [line for line in found.stdout.splitlines() if "postgres" in line]


@pytest.mark.slow
def test_the_quickstart_runs_every_demo_action_and_stops_its_server(world: Path) -> None:
    venv = world / "venv"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            f"{REPO / 'outbox-core'}[embedded]",
        ],
        check=True,
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    data, lines = world / "data", world / "lines.txt"
    completed = subprocess.run(
        [str(venv / "bin" / "outbox"), "quickstart", "--data-dir", str(data), "--file", str(lines)],
        cwd=world,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert f"using an embedded PostgreSQL in {data}" in output
    assert "all 36 demo actions ended DONE" in output
    header, *written = lines.read_text().splitlines()
    assert header.startswith("# outbox quickstart run ") and len(written) == 36
    assert "QUICKSTART_LINE" in output  # the status table
    assert postmasters_of(data) == []
    assert not (data / "pgdata" / "postmaster.pid").exists()
    port = next(
        int(word.split(":")[-1]) for word in output.split() if word.startswith("127.0.0.1:")
    )
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
