"""A wrong setting is one line, the same for the core's settings and a plugin's, for every
command: it names where the value was set (the variable, or the file's table and key), what is
wrong with it and what is accepted, and the command exits 2. Never a pydantic traceback, never
the value (it may be a secret)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox_core import ConfigurationError, OutboxSettings
from outbox_core.cli import main
from outbox_core.testing import OutboxTestDatabase

from .configured_plugin import KIND, ConfiguredSettings

APP = {"OUTBOX_APP_PLUGINS": "tests.configured_plugin", "OUTBOX_STARTUP_WAIT_SECONDS": "0"}

# (variable, value, the one line's message): a choice, a validator, a bound, a list not in JSON.
PLUGIN_CASES = [
    (
        "OUTBOX_CONFIGURED_TLS",
        "ssl",
        "OUTBOX_CONFIGURED_TLS: Input should be 'implicit', 'starttls' or 'none'",
    ),
    (
        "OUTBOX_CONFIGURED_SENDER",
        "not an address",
        "OUTBOX_CONFIGURED_SENDER: not an address of the form local@domain.tld",
    ),
    ("OUTBOX_CONFIGURED_PORT", "0", "OUTBOX_CONFIGURED_PORT: Input should be greater than or"),
    (
        "OUTBOX_CONFIGURED_LABELS",
        "bug",
        "OUTBOX_CONFIGURED_LABELS: cannot be parsed; write a list in JSON, e.g. '[\"name\"]'",
    ),
]
IDS = [case[0] for case in PLUGIN_CASES]


def _one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize(("variable", "value", "message"), PLUGIN_CASES, ids=IDS)
def test_building_a_plugins_section_with_a_wrong_value_is_one_line(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """However the section is built (called, not only load()), the error is the core's."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        ConfiguredSettings()
    assert str(raised.value).startswith(message)
    assert value not in str(raised.value).removeprefix(message)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "only-that-kind"])
@pytest.mark.parametrize(("variable", "value", "message"), PLUGIN_CASES, ids=IDS)
def test_run_refuses_a_plugins_wrong_setting_in_one_line_with_exit_2(
    db: OutboxTestDatabase, variable: str, value: str, message: str, strict: bool
) -> None:
    """Strict start-up, or an executor whose every kind is stopped, refuses to open: a setting
    is wrong, exit 2, as for a wrong core setting."""
    args = ["run", "--kinds", KIND, *(["--strict"] if strict else [])]
    result = CliRunner().invoke(
        main, args, env={**APP, "OUTBOX_DATABASE_URL": db.url, variable: value}
    )
    assert result.exit_code == 2, result.output
    line = _one_line(result.output)
    assert line.startswith("outbox: error: configuration: ")
    assert f"{KIND} (from tests.configured_plugin): {message}" in line


@pytest.mark.parametrize(("variable", "value", "message"), PLUGIN_CASES, ids=IDS)
def test_status_lists_a_kind_whose_setting_is_wrong_with_the_same_line_and_exits_2(
    db: OutboxTestDatabase, variable: str, value: str, message: str
) -> None:
    """The report is printed (the other kinds' counts are what the operator came for), the
    kind that cannot run is in it with the setting's one line, and the exit status says that a
    setting is wrong."""
    result = CliRunner().invoke(
        main,
        ["status", "--json"],
        env={**APP, "OUTBOX_DATABASE_URL": db.url, variable: value},
    )
    assert result.exit_code == 2, result.output
    stopped = json.loads(result.stdout)["stopped_kinds"]
    assert [(s["kind"], s["error"].startswith(message)) for s in stopped] == [(KIND, True)]
    assert result.stderr.splitlines() == [
        f"outbox: error: 1 kind(s) cannot run with these settings: {KIND} (listed above, with "
        "the setting to fix)"
    ]


# Every command, with the arguments it needs to get as far as reading the settings.
COMMANDS = {
    "migrate": ["migrate"],
    "plugins": ["plugins"],
    "status": ["status"],
    "show": ["show", "1"],
    "cancel": ["cancel", "1"],
    "erase": ["erase", "--subject", "account-1"],
    "run": ["run"],
    "run-now": ["run-now", "1"],
    "dashboard": ["dashboard"],
    "quickstart": ["quickstart", "--yes"],
    "actions": ["actions"],
    "resolve": ["resolve", "1", "--not-done", "--reason", "checked"],
    "retry": ["retry", "1", "--reason", "checked"],
}


def test_the_list_of_commands_is_complete() -> None:
    assert set(COMMANDS) == set(main.commands)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "EMAIL=4",
            "OUTBOX_KIND_CONCURRENCY: cannot be parsed; write an object in JSON, "
            "e.g. '{\"EMAIL\": 4}'",
        ),
        ('{"EMAIL": 0}', "OUTBOX_KIND_CONCURRENCY[EMAIL]: Input should be greater than or equal"),
        ("ten", "OUTBOX_LEASE_SECONDS: Input should be a valid number"),
    ],
    ids=["kind-concurrency-not-json", "kind-concurrency-zero", "lease-not-a-number"],
)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_wrong_core_setting_is_one_line_and_exit_2_for_every_command(
    db: OutboxTestDatabase, command: str, value: str, message: str
) -> None:
    variable = message.split(":")[0].split("[")[0]
    result = CliRunner().invoke(
        main, COMMANDS[command], env={"OUTBOX_DATABASE_URL": db.url, variable: value}
    )
    assert result.exit_code == 2, result.output
    assert _one_line(result.output).startswith(f"outbox: error: configuration: {message}")


def test_a_wrong_value_from_the_file_is_named_by_its_table_and_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.toml"
    path.write_text('[outbox]\nlease_seconds = "ten"\n[outbox.configured]\ntls = "ssl"\n')
    monkeypatch.setenv("OUTBOX_CONFIG", str(path))
    with pytest.raises(ConfigurationError, match=rf"^{path} \[outbox\] lease_seconds: Input"):
        OutboxSettings()
    with pytest.raises(ConfigurationError, match=rf"^{path} \[outbox.configured\] tls: Input"):
        ConfiguredSettings()
    # The environment wins over the file: then the variable is what is wrong.
    monkeypatch.setenv("OUTBOX_CONFIGURED_TLS", "tls")
    with pytest.raises(ConfigurationError, match=r"^OUTBOX_CONFIGURED_TLS: Input"):
        ConfiguredSettings()


def test_a_field_with_an_alias_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_SCHEMA", "Not-A-Name")
    with pytest.raises(ConfigurationError, match=r"^OUTBOX_SCHEMA: use a lower-case name"):
        OutboxSettings()


def test_without_a_database_or_the_embedded_extra_the_line_names_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outbox_core import embedded

    def missing() -> None:
        raise embedded.EmbeddedUnavailable(embedded._EXTRA_HINT)

    monkeypatch.setattr(embedded, "_locate_install", missing)
    for command in (["run"], ["quickstart"]):
        result = CliRunner().invoke(main, command, env={"OUTBOX_DATABASE_URL": ""})
        assert result.exit_code == 2, result.output
        assert _one_line(result.output) == (
            "outbox: error: no database configured: set OUTBOX_DATABASE_URL (or pass "
            "--database-url postgresql://user@host:5432/dbname); to try outbox without one, the "
            "embedded PostgreSQL needs the extra: pip install 'outbox-core[embedded]'"
        )
