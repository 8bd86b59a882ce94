"""docs/integrations.md is true: its application kind and its two scripts, written out from the
page's own blocks, migrate and run against a fresh database and confirm exactly the orders
whose transaction committed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from outbox_core.testing import OutboxTestDatabase

from .test_sqlalchemy import url as sqlalchemy_url

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "integrations.md"
BLOCK = re.compile(r"```(?:python|sql)\n(?:#|--) (\S+)\n(.*?)```", re.DOTALL)


def test_the_pages_scripts_confirm_exactly_the_committed_orders(
    outbox_db: OutboxTestDatabase, tmp_path: Path
) -> None:
    files = dict(BLOCK.findall(PAGE.read_text("utf-8")))
    assert set(files) == {
        "shop_outbox/__init__.py",
        "shop_outbox/migrations/0001_confirm_order.sql",
        "shop_sqlalchemy.py",
        "shop_django.py",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    params = conninfo_to_dict(outbox_db.url)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "OUTBOX_APP_PLUGINS": "shop_outbox",
        "OUTBOX_DATABASE_URL": outbox_db.url,
        "SHOP_DATABASE_URL": sqlalchemy_url(outbox_db, "psycopg").render_as_string(False),
        "SHOP_DATABASE_NAME": str(params["dbname"]),
        "SHOP_DATABASE_USER": str(params.get("user") or "postgres"),
        "SHOP_DATABASE_HOST": str(params.get("host") or "127.0.0.1"),
        "SHOP_DATABASE_PORT": str(params.get("port") or "5432"),
    }
    outbox = Path(sys.executable).parent / "outbox"

    def run(*command: str) -> str:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run(str(outbox), "migrate")
    assert run(sys.executable, "shop_sqlalchemy.py").splitlines() == ["confirmed order 1"]
    assert run(sys.executable, "shop_django.py").splitlines() == ["confirmed order 3"]
    assert outbox_db.rows(
        "SELECT idempotency_key, state FROM {schema}.agent_action ORDER BY id"
    ) == [("confirm:1", "DONE"), ("confirm:3", "DONE")]
