"""Secrets are never printed: no ``SecretStr`` setting of any installed plugin (found by walking
the settings classes, so a new secret is covered) and no password of the database URL in the
output of ``outbox status``, ``show``, ``migrate``, ``plugins``, ``erase``, the log lines of
``outbox run`` (its start line, its kinds, its errors, at DEBUG), the errors for bad settings, or
the errors for a database that cannot be reached."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outbox_core import ActionRequest, SectionSettings
from outbox_core.cli import main
from outbox_core.testing import OutboxTestDatabase

PASSWORD = "pAsSwOrD-77c1"


def section_classes() -> Iterator[type[SectionSettings]]:
    """Every settings class of the core and of each installed plugin (``outbox_<name>.settings``,
    the effect packages' shape), subclasses included."""
    for entry in metadata.entry_points(group="outbox_core.plugins"):
        try:
            importlib.import_module(f"outbox_{entry.name}.settings")
        except ModuleNotFoundError:
            continue
    todo: list[type[SectionSettings]] = [SectionSettings]
    seen: set[type[SectionSettings]] = set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if cls.model_config.get("env_prefix"):
            yield cls


def secret_variables() -> dict[str, str]:
    """``OUTBOX_..._<FIELD>``: a distinct secret, for every ``SecretStr`` field."""
    found = {}
    for cls in section_classes():
        for name, info in cls.model_fields.items():
            if SecretStr in (info.annotation, *typing.get_args(info.annotation)):
                variable = cls.variable(name)
                found[variable] = f"sEcReT-{variable.lower().replace('_', '-')}-4b1d"
    return found


SECRETS = secret_variables()


def url_with_password(db: OutboxTestDatabase, **changes: str) -> str:
    """The test database's URL with a password (the server trusts local logins: it is ignored)."""
    params = conninfo_to_dict(db.url)
    params.update({"password": PASSWORD, "host": "127.0.0.1", "port": "5432"}, **changes)
    user = params.get("user", "postgres")
    return f"postgresql://{user}:{PASSWORD}@{params['host']}:{params['port']}/{params['dbname']}"


def environment(db: OutboxTestDatabase, **extra: str) -> dict[str, str]:
    env = {
        **SECRETS,
        "OUTBOX_DATABASE_URL": url_with_password(db),
        "OUTBOX_EMAIL_USERNAME": "relay-user",
        "OUTBOX_STARTUP_WAIT_SECONDS": "0",
    }
    env.update(extra)
    return env


def leaked(text: str) -> list[str]:
    return [secret for secret in (PASSWORD, *SECRETS.values()) if secret.lower() in text.lower()]


def command(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)
    text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        text += "".join(traceback.format_exception(result.exception))
    return text


def outbox_run(env: dict[str, str], *args: str, seconds: float = 4.0) -> str:
    """``outbox run`` in a process of its own for ``seconds`` after its start line (or until it
    exits), then SIGTERM: everything it wrote."""
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("outbox")), "run", "--log-level", "DEBUG", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 60
    started: float | None = None
    while time.monotonic() < deadline and process.poll() is None:
        if started is None and any("executor.started" in line for line in list(lines)):
            started = time.monotonic()
        if started is not None and time.monotonic() - started > seconds:
            break
        time.sleep(0.1)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    reader.join(timeout=10)
    return "".join(lines)


def file_issue(db: OutboxTestDatabase, report: str) -> int:
    """A FILE_ISSUE action to show, cancel and run (its report need not exist)."""
    request = ActionRequest(
        "FILE_ISSUE",
        f"file_issue:{report}",
        f"file_issue:{report}:1",
        payload={"report": report, "generation": 1},
        workspace_id="w",
    )
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, request).id
        conn.commit()
    return action_id


def test_every_plugin_secret_is_found() -> None:
    assert {"OUTBOX_DATABASE_URL", "OUTBOX_EMAIL_PASSWORD", "OUTBOX_SLACK_TOKEN"} <= set(SECRETS)
    assert "OUTBOX_ISSUES_TOKEN" in SECRETS


def test_no_command_prints_a_secret(outbox_db: OutboxTestDatabase) -> None:
    db = outbox_db
    action_id = file_issue(db, "r1")
    env = environment(db)
    outputs = {
        " ".join(args): command(env, *args)
        for args in (
            ["status"],
            ["status", "--json"],
            ["show", str(action_id)],
            ["show", "--payload", str(action_id)],
            ["migrate"],
            ["migrate", "--print"],
            ["plugins"],
            ["erase", "--subject", "nobody"],
            ["cancel", str(action_id)],
            ["--help"],
            ["run", "--help"],
        )
    }
    assert '"kind": "FILE_ISSUE"' in outputs[f"show {action_id}"]
    for args, output in outputs.items():
        assert leaked(output) == [], f"outbox {args}: {output}"


@pytest.mark.parametrize(
    ("change", "args"),
    [
        ({"OUTBOX_LEASE_SECONDS": "abc"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}@127.0.0.1:notaport/db"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"mysql://u:{PASSWORD}@127.0.0.1/db"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}@[::1/db"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}%zz@127.0.0.1/db"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"host=127.0.0.1 password={PASSWORD} port=x"}, ["status"]),
        ({"OUTBOX_DATABASE_URL": f"postgresql://nobody:{PASSWORD}@127.0.0.1:5432/x"}, ["migrate"]),
        (
            {"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}@no-such-host.invalid/db"},
            ["show", "1"],
        ),
        ({"OUTBOX_DATABASE_URL": f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"}, ["run"]),
        ({"OUTBOX_SLACK_TOKEN": "xoxb-sEcReT-with space"}, ["run", "--strict"]),
        ({"OUTBOX_EMAIL_USERNAME": ""}, ["run", "--strict"]),
        ({"OUTBOX_ISSUES_API_URL": "not a url"}, ["run", "--strict"]),
    ],
)
def test_no_error_for_bad_settings_or_an_unreachable_database_prints_a_secret(
    outbox_db: OutboxTestDatabase, change: dict[str, str], args: list[str]
) -> None:
    env = environment(outbox_db, **change)
    if env.get("OUTBOX_EMAIL_USERNAME") == "":
        del env["OUTBOX_EMAIL_USERNAME"]  # a password without a user: refused
    output = outbox_run(env, *args[1:]) if args[0] == "run" else command(env, *args)
    assert "error" in output.lower() or "stopped" in output.lower(), output
    assert leaked(output) == [] and "sEcReT" not in output, output


def test_a_config_file_holding_secrets_under_mistyped_keys_is_refused_without_them(
    outbox_db: OutboxTestDatabase, tmp_path: Path
) -> None:
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[outbox]\ndatabase_ulr = "postgresql://u:{PASSWORD}@h/db"\n'
        f'[outbox.slack]\ntokn = "{SECRETS["OUTBOX_SLACK_TOKEN"]}"\n'
    )
    env = environment(outbox_db, OUTBOX_CONFIG=str(config))
    for args in (["status"], ["run", "--strict"]):
        output = outbox_run(env, "--strict") if args[0] == "run" else command(env, *args)
        assert "has no key" in output, output
        assert leaked(output) == [], output


def test_outbox_run_never_logs_a_secret(outbox_db: OutboxTestDatabase) -> None:
    """The start line, the kinds it serves and stops, its connections and its attempts at
    DEBUG, with every secret set and actions to run against providers it cannot reach."""
    db = outbox_db
    file_issue(db, "r2")
    env = environment(
        db,
        OUTBOX_SLACK_BASE_URL="http://127.0.0.1:1/api/",
        OUTBOX_ISSUES_API_URL="http://127.0.0.1:1",
        OUTBOX_ISSUES_REPOSITORY="o/r",
        OUTBOX_EMAIL_HOST="127.0.0.1",
        OUTBOX_EMAIL_PORT="1",
    )
    output = outbox_run(env, "--log-format", "json")
    assert "executor.started" in output, output
    assert leaked(output) == [], output
