"""The example files that a docs page holds: each a code block whose first line names it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from outbox_core.testing import OutboxTestDatabase

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```(?:python|sql)\n(?:#|--) (\S+)\n(.*?)```", re.DOTALL)


def page_files(name: str) -> dict[str, str]:
    """{relative path: text} of every block of ``docs/<name>`` whose first line names a file."""
    return dict(BLOCK.findall((REPO / "docs" / name).read_text("utf-8")))


class Example:
    """A folder holding pages' example files, run with a fresh database's names in the
    environment (``OUTBOX_DATABASE_URL`` and the ``SHOP_DATABASE_*`` of the examples)."""

    def __init__(self, folder: Path, db: OutboxTestDatabase, sqlalchemy_url: str) -> None:
        self.folder = folder
        params = conninfo_to_dict(db.url)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(folder),
            "OUTBOX_APP_PLUGINS": "shop_outbox",
            "OUTBOX_DATABASE_URL": db.url,
            "SHOP_DATABASE_URL": sqlalchemy_url,
            "SHOP_DATABASE_NAME": str(params["dbname"]),
            "SHOP_DATABASE_USER": str(params.get("user") or "postgres"),
            "SHOP_DATABASE_HOST": str(params.get("host") or "127.0.0.1"),
            "SHOP_DATABASE_PORT": str(params.get("port") or "5432"),
        }

    def write(self, files: dict[str, str]) -> None:
        for relative, text in files.items():
            (self.folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / relative).write_text(text)

    def run(self, *command: str) -> str:
        """Run ``command`` in the folder (``outbox`` is this interpreter's); its stdout."""
        if command[0] == "outbox":
            command = (str(Path(sys.executable).parent / "outbox"), *command[1:])
        elif command[0] == "python":
            command = (sys.executable, *command[1:])
        done = subprocess.run(
            command, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout
