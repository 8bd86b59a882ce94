"""Running outbox: `outbox run` (the executor), `dashboard` (the operators' web page) and
`quickstart` (a demo on an embedded or scratch database)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import click
import psycopg
import psycopg.sql

from ...observability import LOG_FORMATS, LOG_LEVELS, configure_logging
from ..database import check_migrated, connected, database
from ..group import State, command
from ..guard import EXIT_USAGE, fail


@command()
@click.option("--concurrency", type=click.IntRange(min=1), help="attempts running at once")
@click.option("--kinds", metavar="KIND,KIND", help="serve only these kinds")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="expose metrics for Prometheus on this port",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="embedded server's data folder (no database configured)",
)
@click.option(
    "--strict",
    is_flag=True,
    help="refuse to start when a kind cannot run with these settings (OUTBOX_STRICT_STARTUP); "
    "without it that kind is stopped and the others run",
)
@click.option(
    "--once",
    is_flag=True,
    help="run what is due now, then exit (0: nothing it serves is due any more); makes nothing "
    "due that is not",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="the lowest level logged on stderr",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="text: time, level, event and fields; json: one object a line with the fields",
)
@click.option(
    "--library-log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="the lowest level logged from the libraries (httpx's line per request, psycopg.pool's "
    "per connection: INFO shows them)",
)
def run(
    state: State,
    concurrency: int | None,
    kinds: str | None,
    metrics_port: int | None,
    data_dir: Path | None,
    strict: bool,
    once: bool,
    log_level: str,
    log_format: str,
    library_log_level: str,
) -> None:
    """Run the executor until SIGTERM or Ctrl-C: claim due lane heads, run their attempts.

    With --once it runs what is due now and exits, printing one line of what it did: the
    expiry and retention sweeps once, then claims until nothing is due (the actions that their
    lanes' endings make due included). It makes nothing due: an action whose not_before, backoff
    or deferral is ahead waits for a later run. Exit 0: nothing it serves is due any more
    (whatever the actions ended as: see outbox status); 1: it could not run (the database);
    2: a wrong option or setting, or a kind stopped (its due actions are still due).

    A kind whose adapter cannot be built with the settings (its plugin's settings are invalid)
    is stopped, logged as executor.kind.stopped, and its actions stay queued; the other kinds
    run. With --strict (or OUTBOX_STRICT_STARTUP=true) the executor refuses to start instead.

    On SIGTERM it stops claiming, lets running attempts finish within OUTBOX_SHUTDOWN_SECONDS,
    and leaves the rest to their leases.

    It logs on stderr (--log-level, --log-format): executor.started with the version, the
    kinds and their plugins, the database's host and schema and the concurrency, while busy
    executor.progress once a minute (OUTBOX_PROGRESS_SECONDS) with the actions claimed and
    ended by state and the attempts running, the events of docs/log-records.md, and
    executor.stopped. The libraries' own records (httpx, psycopg.pool, ...) are logged from
    WARNING on (--library-log-level). Run inside a process whose logging is
    already configured (a handler on the root logger), it leaves that logging alone.
    """
    configure_logging(log_level.upper(), log_format, library_log_level.upper())
    settings = state.settings
    from ...plugins import load_plugins

    load_plugins()  # a plugin that fails, or an allowlist typo, before waiting for the database
    if concurrency is not None:
        settings = settings.model_copy(update={"concurrency": concurrency})
    if strict:
        settings = settings.model_copy(update={"strict_startup": True})
    chosen = None
    if kinds is not None:
        chosen = [kind.strip() for kind in kinds.split(",") if kind.strip()]
        known = state.outbox().registry.kinds
        unknown = [kind for kind in chosen if kind not in known]
        if unknown or not chosen:
            fail(
                f"--kinds: unknown {', '.join(unknown) or '(none given)'}; installed kinds: "
                f"{', '.join(known) or 'none'}",
                EXIT_USAGE,
            )
    if metrics_port is not None:
        from ...metrics_export import serve_prometheus

        serve_prometheus(metrics_port)
    # A worker under a supervisor may start while its database restarts: wait for it.
    with database(settings, data_dir, wait_seconds=settings.startup_wait_seconds) as url:
        from ...executor import Executor
        from ...executor.collector import tune_collector
        from ...outbox import Outbox

        outbox = Outbox.from_settings(settings)
        if not outbox.registry.kinds:
            import logging

            from ...observability import event

            event(
                "executor.kinds.none",
                level=logging.WARNING,
                detail="no installed plugin registers a kind, so there is nothing to run: "
                "install an effect package (pip install outbox-email) or name the "
                "application's modules in OUTBOX_APP_PLUGINS",
            )
        executor = Executor(outbox, url, settings=settings, kinds=chosen)
        if once:
            counts = asyncio.run(_run_due(executor))
            click.echo(
                f"ran what was due: claimed {counts.pop('claimed')}, "
                + ", ".join(f"{name} {count}" for name, count in counts.items())
                + "; nothing it serves was due at its last look"
            )
            if executor.stopped:
                fail(
                    f"{len(executor.stopped)} kind(s) cannot run with these settings, and their "
                    "due actions are still due: "
                    + ", ".join(kind.kind for kind in executor.stopped)
                    + " (executor.kind.stopped above names the setting to fix)",
                    EXIT_USAGE,
                )
            return
        tune_collector()  # this process runs the executor and nothing else
        asyncio.run(_run_executor(executor))


async def _run_due(executor: Any) -> dict[str, int]:
    try:
        counts: dict[str, int] = await executor.run_due()
        return counts
    finally:
        await executor.close()


async def _run_executor(executor: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await executor.run(stop)
    finally:
        await executor.close()


@command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--user",
    metavar="NAME",
    help="the actor of its operators' changes in their audit rows (default: dashboard)",
)
def dashboard(state: State, host: str, port: int, user: str | None) -> None:
    """Serve the operators' dashboard (extra outbox-core[dashboard]): the backlog, blocked
    lanes, UNCERTAIN actions, failures, throughput, the installed kinds; cancel and run-now.
    Bound to 127.0.0.1 by default; bound elsewhere it needs OUTBOX_DASHBOARD_TOKEN, which every
    request must then carry (open it once with ?token=...). It refuses to start when the
    database cannot be reached or is not migrated; if the database goes away while it runs, the
    page says so in a banner and comes back when the database does."""
    import ipaddress

    token = os.environ.get("OUTBOX_DASHBOARD_TOKEN") or None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and token is None:
        fail(
            f"--host {host}: a dashboard bound beyond this machine needs a token; set "
            "OUTBOX_DASHBOARD_TOKEN (a long random string) or bind to 127.0.0.1",
            EXIT_USAGE,
        )
    if token is not None and len(token) < 16:
        fail("OUTBOX_DASHBOARD_TOKEN: use at least 16 characters", EXIT_USAGE)
    url = state.require_url()
    try:
        import uvicorn

        from ...dashboard import create_app
    except ImportError as exc:
        fail(
            f"the dashboard needs its extra ({exc.name} is missing): "
            "pip install 'outbox-core[dashboard]'"
        )
    # As every other command: an unreachable or unmigrated database is one line, before the
    # dashboard listens (the page says so in a banner if the database goes away later).
    with connected(url, autocommit=True) as conn:
        check_migrated(conn, state.settings.schema_name)
    if user is not None and not user.strip():
        fail("--user: give a name, or leave it out for 'dashboard'", EXIT_USAGE)
    app = create_app(state.outbox(), url, token=token, user=user)
    guarded = " (token required)" if token else ""
    click.echo(f"outbox dashboard on http://{host}:{port}/{guarded}")
    # Open pages hold their event streams: a stop waits this long for them, then ends them.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)


@command()
@click.option(
    "--count",
    default=36,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="demo actions to enqueue",
)
@click.option(
    "--lanes",
    default=4,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="lanes to spread them over",
)
@click.option(
    "--file",
    "target",
    default="outbox-quickstart.txt",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="where the demo kind appends its lines",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="embedded server's data folder (no database configured)",
)
@click.option(
    "--yes",
    is_flag=True,
    help="with a database configured: go ahead (the demo runs in a scratch schema, dropped after)",
)
@click.option(
    "--clean",
    is_flag=True,
    help="remove what the quickstart made (the embedded server's data folder, the demo file; as "
    "root the system user outbox-pg) and exit",
)
def quickstart(
    state: State,
    count: int,
    lanes: int,
    target: Path,
    data_dir: Path | None,
    yes: bool,
    clean: bool,
) -> None:
    """Try outbox: migrate, enqueue demo actions whose effect is lines in a file (started afresh
    each run), run them with a progress bar, and print the status table.

    With no database configured it starts an embedded PostgreSQL and stops it at the end; its
    data folder stays for the next run (as root: /var/lib/outbox/postgres, owned by the system
    user outbox-pg, which it creates). `outbox quickstart --clean` removes them. With a
    database configured it asks for --yes, and runs in a scratch schema that it drops after.
    """
    from ...quickstart import demo_file_is_ours, run_quickstart

    settings = state.settings
    url = settings.dsn()
    if clean:
        _clean_quickstart(target, data_dir, configured=url is not None)
        return
    if not demo_file_is_ours(target):
        fail(
            f"--file {target}: the file exists and was not written by outbox quickstart; pass "
            "another --file (the quickstart starts its file afresh each run)",
            EXIT_USAGE,
        )
    if url is None:
        with database(settings, data_dir, migrate_first=True) as embedded:
            done = run_quickstart(embedded, settings, target=target, count=count, lanes=lanes)
    else:
        from ...observability import database_label

        scratch = f"outbox_quickstart_{os.getpid()}"
        if not yes:
            fail(
                f"a database is configured ({database_label(url)}): the quickstart would write "
                f"to it (in a scratch schema, {scratch}, that it drops after); pass --yes to go "
                "ahead, or unset OUTBOX_DATABASE_URL to try it on an embedded PostgreSQL",
                EXIT_USAGE,
            )
        settings = settings.model_copy(update={"schema_name": scratch})
        try:
            with database(settings, data_dir, migrate_first=True) as configured:
                done = run_quickstart(configured, settings, target=target, count=count, lanes=lanes)
        finally:
            with connected(url, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        psycopg.sql.Identifier(scratch)
                    )
                )
        click.echo(f"dropped the scratch schema {scratch}")
    if done != count:
        fail(f"{count - done} of {count} demo actions did not end DONE")
    click.echo(f"all {count} demo actions ended DONE; see {target}")


def _clean_quickstart(target: Path, data_dir: Path | None, *, configured: bool) -> None:
    """``outbox quickstart --clean``: what the quickstart left, removed, one line each."""
    from ...embedded import EmbeddedPostgres
    from ...quickstart import demo_file_is_ours

    removed = EmbeddedPostgres(data_dir).remove()
    if target.is_file() and demo_file_is_ours(target):
        target.unlink()
        removed.append(f"the demo file {target}")
    for line in removed:
        click.echo(f"removed {line}")
    if not removed:
        click.echo("nothing to remove")
    if configured:
        click.echo(
            "(the configured database keeps nothing of the quickstart: its scratch schema was "
            "dropped when it ended)"
        )
