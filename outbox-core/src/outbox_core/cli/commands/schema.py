"""The database's schema: `outbox migrate` applies (or prints) the migrations of the core and
every installed plugin."""

from __future__ import annotations

from typing import Any

import click

from ..database import connected
from ..group import State, command


@command()
@click.option("--print", "print_sql", is_flag=True, help="print the SQL instead of applying it")
@click.option(
    "--all", "print_all", is_flag=True, help="with --print: every migration, not only pending ones"
)
def migrate(state: State, print_sql: bool, print_all: bool) -> None:
    """Apply the pending migrations of the core and every installed plugin (core first).

    Safe to run from many replicas at once: an advisory lock serialises them. With --print,
    show the SQL for teams that apply it with their own tool (pending migrations when a
    database is configured, every migration otherwise or with --all).
    """
    from ... import migrations
    from ...plugins import load_plugins

    settings = state.settings
    lines = load_plugins().migration_lines
    if print_sql:
        done: dict[Any, Any] = {}
        url = settings.dsn()
        if url is not None and not print_all:
            with connected(url, autocommit=True) as conn:
                done = migrations.applied(conn, settings.schema_name)
        click.echo(migrations.script(settings.schema_name, migrations.plan(lines, done)), nl=False)
        return
    with connected(state.require_url(), autocommit=True) as conn:
        applied = migrations.migrate(conn, settings.schema_name, lines)
    if applied:
        for migration in applied:
            click.echo(f"applied {migration.label}")
    else:
        click.echo("nothing to apply: the schema is up to date")
