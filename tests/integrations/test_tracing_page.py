"""docs/tracing.md is true: its example, with the application kind of docs/integrations.md,
shows the request's span and the attempt's span in one trace."""

from __future__ import annotations

from pathlib import Path

from outbox_core.testing import OutboxTestDatabase

from .pages import Example, page_files
from .test_sqlalchemy import url


def test_the_pages_example_puts_the_request_and_the_attempt_in_one_trace(
    outbox_db: OutboxTestDatabase, tmp_path: Path
) -> None:
    files = page_files("tracing.md")
    assert set(files) == {"shop_traced.py"}
    shop = {name: text for name, text in page_files("integrations.md").items() if "outbox/" in name}
    example = Example(tmp_path, outbox_db, url(outbox_db, "psycopg").render_as_string(False))
    example.write({**shop, **files})
    example.run("outbox", "migrate")
    assert example.run("python", "shop_traced.py").splitlines() == [
        "confirmed order 5",
        "one trace: POST /orders -> outbox.execute CONFIRM_ORDER Done",
    ]
    assert outbox_db.scalar("SELECT trace_context->>'traceparent' FROM {schema}.agent_action")
