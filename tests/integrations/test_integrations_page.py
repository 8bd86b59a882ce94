"""docs/integrations.md is true: its application kind and its two scripts, written out from the
page's own blocks, migrate and enqueue against a fresh database, and `outbox run --once` then
confirms exactly the orders whose transaction committed."""

from __future__ import annotations

from pathlib import Path

from outbox_core.testing import OutboxTestDatabase

from .pages import Example, page_files
from .test_sqlalchemy import url


def test_the_pages_scripts_confirm_exactly_the_committed_orders(
    outbox_db: OutboxTestDatabase, tmp_path: Path
) -> None:
    files = page_files("integrations.md")
    assert set(files) == {
        "shop_outbox/__init__.py",
        "shop_outbox/migrations/0001_confirm_order.sql",
        "shop_sqlalchemy.py",
        "shop_django.py",
    }
    example = Example(tmp_path, outbox_db, url(outbox_db, "psycopg").render_as_string(False))
    example.write(files)
    example.run("outbox", "migrate")
    assert example.run("python", "shop_sqlalchemy.py") == ""
    assert example.run("python", "shop_django.py") == ""
    *confirmed, summary = example.run("outbox", "run", "--once").splitlines()
    assert sorted(confirmed) == ["confirmed order 1", "confirmed order 3"]
    assert summary.startswith("ran what was due: claimed 2, done 2, ")
    assert outbox_db.rows(
        "SELECT idempotency_key, state FROM {schema}.agent_action ORDER BY id"
    ) == [("confirm:1", "DONE"), ("confirm:3", "DONE")]
