"""`outbox plugins`: what is installed, as JSON."""

from __future__ import annotations

import json

import click

from ..database import connected
from ..group import State, command


@command()
def plugins(state: State) -> None:
    """Print the installed plugins as JSON: distribution, version, kinds with their variants
    and derived JSON path, migration lines and (with a database) whether they are applied."""
    from ... import migrations
    from ...plugins import load_plugins

    host = load_plugins()
    described = host.describe()
    url = state.settings.dsn()
    if url is not None:
        with connected(url, autocommit=True) as conn:
            done = migrations.applied(conn, state.settings.schema_name)
        for plugin in described:
            status = {}
            for line in host.migration_lines:
                if line.name in plugin["migration_lines"]:
                    versions = [m.version for m in line.files()]
                    have = [v for v in versions if (line.name, v) in done]
                    status[line.name] = {
                        "applied": have,
                        "pending": [v for v in versions if v not in have],
                    }
            plugin["migrations"] = status
    out = {"plugins": described, "blocked": host.blocked}
    click.echo(json.dumps(out, indent=2, default=str))
