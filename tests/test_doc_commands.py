"""Every shell block of the READMEs and docs works when pasted: each block is run against a
fresh database of the test server, or says on the line before it why it is not
(`<!-- doc-test: skip: why -->`: an install from a package index, the test command itself, a
run of minutes that another test makes in its quick form).

The placeholder database URL of the docs is replaced by the test database's; `outbox run` is
stopped with SIGTERM after a few seconds, as an operator would, and must stop cleanly having
used that database (not an embedded server of its own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
    *sorted(REPO.glob("outbox-*/README.md")),
]
BLOCK = re.compile(
    r"(?:<!--\s*doc-test:\s*(?P<marker>[^>]*?)\s*-->[ \t]*\n)?"
    r"^```(?:sh|bash|shell|console)[ \t]*\n(?P<body>.*?)^```",
    re.S | re.M,
)
PLACEHOLDER_URL = "postgresql://app@db.internal:5432/app"
# `outbox run` stops on SIGTERM; the wrapper gives it a few seconds first.
PRELUDE = """
set -euo pipefail
outbox() {
    if [ "${1:-}" = run ]; then
        timeout --preserve-status -s TERM 6 "$(type -P outbox)" "$@"
    else
        command outbox "$@"
    fi
}
"""


@dataclass(frozen=True)
class ShellBlock:
    page: Path
    line: int
    marker: str | None
    body: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def shell_blocks() -> list[ShellBlock]:
    blocks = []
    for page in PAGES:
        text = page.read_text("utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("body"))
            blocks.append(ShellBlock(page, line, match.group("marker"), match.group("body")))
    return blocks


RUNNABLE = [block for block in shell_blocks() if block.marker is None]


def test_every_shell_block_runs_or_says_why_not() -> None:
    assert RUNNABLE, "no shell block is run: the extraction is broken"
    for block in shell_blocks():
        if block.marker is not None:
            reason = block.marker.removeprefix("skip:").strip()
            assert block.marker.startswith("skip:") and reason, (
                f"{block.name}: a doc-test marker is `skip: <why>`, not {block.marker!r}"
            )


def _uri(conninfo: str) -> str:
    """The test database as a URL (the docs export a URL, not a keyword string)."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = str(params.get("host", "127.0.0.1"))
    if host.startswith("/"):
        host = "127.0.0.1"
    return f"postgresql://{params.get('user', 'postgres')}@{host}:{params.get('port', 5432)}/{params['dbname']}"


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_the_shell_block_works_when_pasted(
    block: ShellBlock, empty_database: str, tmp_path: Path
) -> None:
    url = _uri(empty_database)
    script = PRELUDE + block.body.replace(PLACEHOLDER_URL, url)
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if "OUTBOX_DATABASE_URL" not in block.body:
        env["OUTBOX_DATABASE_URL"] = url  # the page says to export it first
    completed = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"{block.name}:\n{output}"
    assert "Traceback" not in output, f"{block.name}:\n{output}"
    assert "embedded" not in output.lower(), f"{block.name} started a server of its own:\n{output}"
    if re.search(r"^\s*outbox migrate\b", block.body, re.M):
        with psycopg.connect(empty_database) as conn:
            applied = conn.execute("SELECT count(*) FROM outbox.schema_migration").fetchone()
        assert applied is not None and applied[0] > 0, f"{block.name} migrated nothing"
