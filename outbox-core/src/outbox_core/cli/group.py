"""The `outbox` group: its help, the options every command shares (--database-url, --schema,
--config), the settings they decide, and :func:`command`, which makes a function one of the
group's commands with those settings and the one-line errors of :mod:`.guard`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigurationError
from ..settings import OutboxSettings
from .guard import EXIT_USAGE, _guard, fail

HELP = """outbox: carry out effects exactly when the transaction that asked for them commits.

Configuration comes from OUTBOX_* environment variables and an optional TOML file
(--config or OUTBOX_CONFIG, table [outbox]); options on the command line win. With no
database URL, `run` and `quickstart` start an embedded PostgreSQL of their own (needs
pip install 'outbox-core[embedded]'); production always names a real server.
"""

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


class _ActionId(click.IntRange):
    """An action's id: a whole number from 1 (``'abc' is not a valid integer: an action id is a
    whole number from 1``, not click's "is not a valid integer range")."""

    name = "integer: an action id is a whole number from 1"


ACTION_ID = _ActionId(min=1)

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
        from ..outbox import Outbox

        return Outbox.from_settings(self.settings)


# The options every command shares: given before the command (``outbox --schema s status``)
# or after it (``outbox status --schema s``), as a user types them; after wins.
SHARED_OPTIONS = (
    click.Option(
        ["--database-url"], metavar="URL", help="postgresql:// URL (default: OUTBOX_DATABASE_URL)"
    ),
    click.Option(
        ["--schema"],
        metavar="NAME",
        help="schema of outbox's tables (default: OUTBOX_SCHEMA or outbox)",
    ),
    click.Option(
        ["--config"],
        type=click.Path(dir_okay=False, path_type=Path),
        help="TOML file with an [outbox] table (default: OUTBOX_CONFIG)",
    ),
)


def _apply_shared(
    state: State, database_url: str | None, schema: str | None, config: Path | None
) -> None:
    """What the shared options say, into ``state`` (and OUTBOX_CONFIG for --config)."""
    if config is not None:
        if not config.is_file():
            fail(f"--config {config}: no such file", EXIT_USAGE)
        os.environ["OUTBOX_CONFIG"] = str(config)
    if database_url is not None:
        state.overrides["database_url"] = database_url
    if schema is not None:
        state.overrides["schema_name"] = schema


@click.group(
    help=HELP + CONFIG_HELP,
    params=list(SHARED_OPTIONS),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="outbox-core", prog_name="outbox")
@click.pass_context
def main(
    ctx: click.Context, database_url: str | None, schema: str | None, config: Path | None
) -> None:
    if os.environ.get("OUTBOX_APP_PLUGINS") and "" not in sys.path and os.getcwd() not in sys.path:
        # As uvicorn and celery do: the application's modules are found from where it runs.
        sys.path.insert(0, os.getcwd())
    ctx.obj = State({})
    _apply_shared(ctx.obj, database_url, schema, config)


def command(name: str | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """Make the function below (with its click options) the group's command ``name`` (default:
    the function's name): it also takes the shared options (after the command name), its help
    ends with the configuration, it gets the group's :class:`State` first, and its errors are
    one line (:func:`.guard._guard`)."""

    def decorate(function: Callable[..., Any]) -> click.Command:
        guarded = _guard(function)

        def with_shared(
            state: State,
            *args: Any,
            database_url: str | None = None,
            schema: str | None = None,
            config: Path | None = None,
            **kwargs: Any,
        ) -> Any:
            _apply_shared(state, database_url, schema, config)
            return guarded(state, *args, **kwargs)

        functools.update_wrapper(with_shared, guarded)
        made = main.command(name, epilog=CONFIG_HELP)(click.pass_obj(with_shared))
        made.params.extend(SHARED_OPTIONS)
        return made

    return decorate
