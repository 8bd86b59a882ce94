"""Errors a person reads in one line: a database never migrated, an out-of-range option, a
typo in the configuration."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import click
import psycopg
import pytest
from click.testing import CliRunner
from pydantic_settings import SettingsConfigDict

from outbox_core import ConfigurationError, OutboxSettings, SectionSettings
from outbox_core.cli import MISSING_OBJECT, _guard, main
from outbox_core.testing import OutboxTestDatabase


@pytest.mark.parametrize(
    "args",
    [["run"], ["status"], ["status", "--json"], ["show", "1"], ["cancel", "1"]],
    ids=lambda args: " ".join(args),
)
def test_a_database_never_migrated_is_one_line_saying_run_migrate(
    unmigrated_url: str, args: list[str]
) -> None:
    result = CliRunner().invoke(
        main, args, env={"OUTBOX_DATABASE_URL": unmigrated_url, "OUTBOX_STARTUP_WAIT_SECONDS": "0"}
    )
    assert result.exit_code == 1, result.output
    assert "run `outbox migrate`" in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, psycopg.Error)


def _run_outbox(url: str, *args: str, schema: str = "outbox") -> subprocess.CompletedProcess[str]:
    """``outbox run`` in a process of its own (its logging as an operator sees it)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "run", *args],
        env={
            **env,
            "OUTBOX_DATABASE_URL": url,
            "OUTBOX_SCHEMA": schema,
            "OUTBOX_STARTUP_WAIT_SECONDS": "0",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_run_on_a_database_never_migrated_refuses_before_it_starts(unmigrated_url: str) -> None:
    """One line and exit 1: no executor.started, executor.stopped or traceback around it."""
    done = _run_outbox(unmigrated_url)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "outbox: error: the database has no outbox schema 'outbox' (never migrated, or another "
        "OUTBOX_SCHEMA): run `outbox migrate`"
    ]


def test_run_on_a_schema_behind_this_build_names_the_missing_migration(
    db: OutboxTestDatabase,
) -> None:
    from outbox_core.migrations import core_line

    latest = core_line().files()[-1]
    db.execute(
        "DELETE FROM {schema}.schema_migration WHERE line = 'core' AND version = %s",
        (latest.version,),
    )
    done = _run_outbox(db.url, schema=db.schema)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"outbox: error: the schema {db.schema!r} lacks migrations this build needs ({latest.label}): "
        "run `outbox migrate`"
    ]


@pytest.mark.parametrize("error", MISSING_OBJECT, ids=lambda error: error.__name__)
@pytest.mark.parametrize("wrapped", ["bare", "caused", "group"])
def test_every_missing_object_error_of_every_command_says_run_migrate(
    error: type[psycopg.Error], wrapped: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command is wrapped by _guard; each missing-object class, raised as is, as the
    cause of another error, or from the executor's tasks in a group, is one line."""

    def command() -> None:
        exc = error("missing")
        if wrapped == "caused":
            raise RuntimeError("while claiming") from exc
        if wrapped == "group":
            raise ExceptionGroup("tasks", [exc])
        raise exc

    guarded = {
        name
        for name, each in main.commands.items()
        if getattr(each.callback, "__qualname__", "") == "_guard.<locals>.wrapper"
    }
    assert guarded == set(main.commands)
    with pytest.raises(SystemExit) as exited:
        _guard(command)()
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().endswith("run `outbox migrate`")


def test_other_errors_pass_through_the_guard() -> None:
    def command() -> None:
        raise psycopg.errors.UniqueViolation("not about migrations")

    with pytest.raises(psycopg.errors.UniqueViolation):
        _guard(command)()


def _numeric_parameters() -> list[tuple[str, click.Parameter]]:
    return [
        (name, param)
        for name, command in sorted(main.commands.items())
        for param in command.params
        if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))
    ]


def _out_of_range(param: click.Parameter) -> list[str]:
    """A value outside ``param``'s range: below its minimum, else above its maximum."""
    bounds = param.type
    assert isinstance(bounds, (click.IntRange, click.FloatRange)), (
        f"{param.name}: a numeric option needs click.IntRange or click.FloatRange"
    )
    value = bounds.min - 1 if bounds.min is not None else bounds.max + 1  # type: ignore[operator]
    if isinstance(param, click.Argument):
        return [str(value)]
    return [param.opts[0], str(value)]


def test_every_numeric_option_has_bounds() -> None:
    unbounded = [
        f"{name} {param.name}"
        for name, param in _numeric_parameters()
        if not isinstance(param.type, (click.IntRange, click.FloatRange))
        or (param.type.min is None and param.type.max is None)
    ]
    assert unbounded == []


@pytest.mark.parametrize(
    ("command", "param"),
    _numeric_parameters(),
    ids=[f"{name}-{param.name}" for name, param in _numeric_parameters()],
)
def test_a_numeric_option_out_of_range_is_refused_with_its_range(
    command: str, param: click.Parameter
) -> None:
    result = CliRunner().invoke(
        main,
        [command, *_out_of_range(param)],
        env={"OUTBOX_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/never_reached"},
    )
    assert result.exit_code == 2, result.output
    assert "is not in the range" in result.output
    assert "Traceback" not in result.output


@pytest.fixture
def config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], Path]:
    """Write the TOML file that OUTBOX_CONFIG names; warnings are logged afresh."""
    from outbox_core import settings

    monkeypatch.setattr(settings, "_warned", set(), raising=False)

    def write(text: str) -> Path:
        path = tmp_path / "outbox.toml"
        path.write_text(text, "utf-8")
        monkeypatch.setenv("OUTBOX_CONFIG", str(path))
        return path

    return write


class CliProbeSettings(SectionSettings):
    """A plugin's settings section of this test's own: its table is one the process knows."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_CLIPROBE_")
    toml_section: ClassVar[str] = "outbox.cliprobe"
    sender: str = ""


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_unknown_key_of_the_outbox_table_is_an_error_naming_the_nearest_key(
    config_file: Callable[[str], Path],
) -> None:
    config_file('[outbox]\nlease_second = 5\nschema = "mine"\n')
    with pytest.raises(ConfigurationError, match=r"no key 'lease_second' \(did you mean "):
        OutboxSettings.load()
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 2, result.output
    assert "'lease_second' (did you mean 'lease_seconds'?)" in result.output
    assert "Traceback" not in result.output


def test_the_documented_keys_of_the_outbox_table_are_read(
    config_file: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    config_file('[outbox]\nlease_seconds = 120\nschema = "mine"\n[outbox.cliprobe]\nsender = "a"\n')
    loaded = OutboxSettings.load()
    assert (loaded.lease_seconds, loaded.schema_name) == (120, "mine")
    assert _warnings(caplog) == []


def test_a_file_without_its_outbox_table_is_a_warning(
    config_file: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    config_file("[tool.other]\nlease_seconds = 5\n")
    assert OutboxSettings.load().lease_seconds == 300
    [warning] = _warnings(caplog)
    assert warning.startswith("config.table.missing ")


def test_an_unknown_plugin_table_is_a_warning_naming_the_nearest(
    config_file: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    config_file("[outbox]\nconcurrency = 3\n[outbox.cliprobr]\nsender = 'a'\n")
    assert OutboxSettings.load().concurrency == 3
    [warning] = _warnings(caplog)
    assert warning.startswith("config.table.unknown ") and "table=outbox.cliprobr" in warning
    assert "did you mean 'outbox.cliprobe'?" in warning


def test_an_unknown_plugin_name_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from outbox_core import settings
    from outbox_core.plugins import build_host

    monkeypatch.setattr(settings, "_warned", set(), raising=False)
    # The test application's module is a plugin this process knows (only the core is installed
    # in the core's own test session); the blocklist names it with a typo, so blocks nothing.
    monkeypatch.setenv("OUTBOX_APP_PLUGINS", "tests.app_plugin")
    monkeypatch.setenv("OUTBOX_DISABLE_PLUGINS", "tests.app_plugn")
    host = build_host()
    assert host.blocked == []
    [warning] = _warnings(caplog)
    assert "variable=OUTBOX_DISABLE_PLUGINS plugin=tests.app_plugn" in warning
    assert "did you mean 'tests.app_plugin'?" in warning


def test_environment_variables_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Other programs share the OUTBOX_ prefix: an unknown variable is neither an error nor a
    warning."""
    monkeypatch.setenv("OUTBOX_LEASE_SECOND", "5")
    monkeypatch.setenv("OUTBOX_SOMETHING_ELSE", "x")
    assert OutboxSettings.load().lease_seconds == 300
    assert _warnings(caplog) == []


def test_an_application_plugins_own_table_is_known(tmp_path: Path) -> None:
    """A module named in OUTBOX_APP_PLUGINS reads its table: ``[outbox.myapp]`` for
    ``myapp.outbox_plugin``, and the section its settings class declares
    (``[outbox.configured]`` of ``tests.configured_plugin``), though nothing imported that
    class yet when the core's settings are read."""
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "outbox_plugin.py").write_text(
        "from outbox_core import hookimpl\n\n\n@hookimpl\ndef outbox_register_kinds(register):\n"
        "    pass\n"
    )
    config = tmp_path / "outbox.toml"
    config.write_text(
        '[outbox]\nconcurrency = 3\n[outbox.myapp]\ncolour = "blue"\n'
        '[outbox.configured]\ntls = "none"\n[outbox.nosuch]\nx = 1\n'
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "migrate", "--print"],
        env={
            **env,
            "OUTBOX_CONFIG": str(config),
            "OUTBOX_APP_PLUGINS": "tests.configured_plugin,myapp.outbox_plugin",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])]),
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    unknown = [line for line in done.stderr.splitlines() if "config.table.unknown" in line]
    assert len(unknown) == 1 and "table=outbox.nosuch" in unknown[0], done.stderr
