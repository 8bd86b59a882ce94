"""Settings: OUTBOX_SLACK_* read at build, refused with the variable's name, never the token."""

from __future__ import annotations

import pytest

from outbox_core import ConfigurationError, OutboxSettings
from outbox_slack import SlackPostAdapter, SlackSettings


def test_an_invalid_setting_names_the_variable_and_never_prints_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_SLACK_TOKEN", "xoxb-secret value")
    monkeypatch.setenv("OUTBOX_SLACK_BASE_URL", "slack.com")

    with pytest.raises(ConfigurationError) as refused:
        SlackPostAdapter.build(OutboxSettings())

    message = str(refused.value)
    assert "OUTBOX_SLACK_TOKEN" in message and "OUTBOX_SLACK_BASE_URL" in message
    assert "secret" not in message


def test_a_request_timeout_beyond_the_fence_margin_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_SLACK_REQUEST_TIMEOUT_SECONDS", "90")

    with pytest.raises(ConfigurationError, match="fence margin"):
        SlackPostAdapter.build(OutboxSettings())


def test_the_token_is_a_secret_and_the_base_url_ends_with_a_slash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_SLACK_TOKEN", " xoxb-123 ")
    monkeypatch.setenv("OUTBOX_SLACK_BASE_URL", "http://127.0.0.1:9/api")

    settings = SlackSettings()

    assert "xoxb-123" not in repr(settings)
    assert settings.token is not None and settings.token.get_secret_value() == "xoxb-123"
    assert settings.base_url == "http://127.0.0.1:9/api/"
