"""SMTP settings come from the core's configuration: the environment, then the TOML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox_core import ConfigurationError, OutboxSettings
from outbox_email import EmailAdapter, EmailSettings, NoticeRegistry
from outbox_email.settings import TlsMode


def test_settings_are_read_from_outbox_email_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_EMAIL_HOST", "smtp.example.com")
    monkeypatch.setenv("OUTBOX_EMAIL_TLS", "implicit")
    monkeypatch.setenv("OUTBOX_EMAIL_USERNAME", "mailer")
    monkeypatch.setenv("OUTBOX_EMAIL_PASSWORD", "hunter2")
    monkeypatch.setenv("OUTBOX_EMAIL_SENDER", "Example <noreply@example.com>")

    settings = EmailSettings()

    assert (settings.host, settings.tls, settings.effective_port) == (
        "smtp.example.com",
        "implicit",
        465,
    )
    assert settings.effective_message_id_domain == "example.com"
    assert settings.password is not None and settings.password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())


def test_settings_are_read_from_the_toml_file_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "outbox.toml"
    config.write_text(
        '[outbox.email]\nhost = "relay.internal"\nport = 2525\ntls = "none"\n'
        'sender = "ops@example.org"\nmessage_id_domain = "mail.example.org"\n'
    )
    monkeypatch.setenv("OUTBOX_CONFIG", str(config))
    monkeypatch.setenv("OUTBOX_EMAIL_PORT", "2526")

    settings = EmailSettings()

    assert (settings.host, settings.effective_port, settings.tls) == (
        "relay.internal",
        2526,
        "none",
    )
    assert settings.effective_message_id_domain == "mail.example.org"


@pytest.mark.parametrize(("tls", "port"), [("implicit", 465), ("starttls", 587), ("none", 25)])
def test_the_default_port_follows_the_tls_mode(tls: TlsMode, port: int) -> None:
    assert EmailSettings(tls=tls).effective_port == port


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sender": "not an address"}, "OUTBOX_EMAIL_SENDER: not an ASCII address"),
        ({"tls": "ssl"}, "OUTBOX_EMAIL_TLS: Input should be .implicit., .starttls. or .none."),
        ({"password": "x"}, "username is not"),
        ({"message_id_domain": "bad domain"}, "plain domain"),
    ],
)
def test_malformed_settings_are_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        EmailSettings(**values)  # type: ignore[arg-type]


def test_a_send_timeout_beyond_the_fence_margin_is_refused_when_the_adapter_is_built() -> None:
    bound = EmailAdapter.bind(NoticeRegistry(), settings=EmailSettings(send_timeout_seconds=60))
    with pytest.raises(ConfigurationError, match="below the fence margin"):
        bound.build(OutboxSettings(fence_margin_seconds=60))
