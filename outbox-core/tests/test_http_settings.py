"""The settings base of an HTTP provider (``outbox_core.http_settings``): its base URLs, token
and timeouts are loaded and checked once, and a wrong value names the package's own variable."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import SecretStr
from pydantic_settings import SettingsConfigDict

from outbox_core import ConfigurationError
from outbox_core.http_settings import HttpProviderSettings


class ProxySettings(HttpProviderSettings):
    model_config = SettingsConfigDict(env_prefix="OUTBOX_PROXYTEST_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.proxytest"
    url_fields: ClassVar[tuple[str, ...]] = ("base_url", "other_url")
    url_expected: ClassVar[str] = "an http(s) URL such as http://localhost:4000/v1"
    token_field: ClassVar[str | None] = "api_key"

    base_url: str | None = None
    other_url: str = "https://example.com/"
    api_key: SecretStr | None = None


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_CONFIG", raising=False)


def test_a_base_url_is_kept_without_its_trailing_slash() -> None:
    settings = ProxySettings(base_url="http://localhost:4000/v1/")
    assert settings.base_url == "http://localhost:4000/v1"


def test_a_url_fields_default_is_checked_too() -> None:
    assert ProxySettings().other_url == "https://example.com"


def test_an_unset_base_url_stays_unset() -> None:
    assert ProxySettings().base_url is None


@pytest.mark.parametrize("url", ["localhost:4000", "ftp://host/v1", "http://", "/v1"])
def test_a_url_that_is_not_http_with_a_host_names_the_packages_variable(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("OUTBOX_PROXYTEST_BASE_URL", url)
    with pytest.raises(ConfigurationError) as caught:
        ProxySettings()
    assert str(caught.value) == (
        "OUTBOX_PROXYTEST_BASE_URL: expected an http(s) URL such as http://localhost:4000/v1"
    )


@pytest.mark.parametrize("field", ["connect_timeout_seconds", "request_timeout_seconds"])
def test_a_timeout_must_be_above_zero(field: str) -> None:
    with pytest.raises(ConfigurationError, match=f"OUTBOX_PROXYTEST_{field.upper()}: "):
        ProxySettings(**{field: 0})


def test_the_token_is_sent_as_a_bearer_token_and_unset_sends_none() -> None:
    assert ProxySettings(api_key=SecretStr("k-1")).bearer() == {"Authorization": "Bearer k-1"}
    assert ProxySettings().bearer() == {}


def test_the_token_is_never_in_the_settings_text() -> None:
    assert "k-1" not in repr(ProxySettings(api_key=SecretStr("k-1")))
