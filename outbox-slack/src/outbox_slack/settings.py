"""Slack settings: ``OUTBOX_SLACK_*`` environment variables, or the ``[outbox.slack]`` table of
the file ``OUTBOX_CONFIG`` names. The token is a ``SecretStr`` and never printed."""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from outbox_core import SectionSettings

SLACK_API = "https://slack.com/api/"


class SlackSettings(SectionSettings):
    """How the ``SLACK_POST`` adapter reaches the Slack Web API. Every field is also
    ``OUTBOX_SLACK_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_SLACK_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.slack"

    token: SecretStr | None = Field(
        default=None,
        description="the bot token (xoxb-...) with chat:write and the channels' *:history "
        "scopes; unset: every post ends FAILED with NOT_CONFIGURED",
    )
    base_url: str = Field(
        default=SLACK_API,
        description="the Web API's base URL; a loopback server's in tests",
    )
    connect_timeout_seconds: float = Field(
        default=5.0, gt=0, description="TCP connect and TLS handshake (nothing sent yet)"
    )
    request_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        description="one whole request; below the core's fence_margin_seconds (60), since a "
        "post must end within the lease that begin_write() guarantees",
    )
    max_connections: int = Field(
        default=10, ge=1, le=1000, description="HTTP connections (and posts at once) per executor"
    )
    rate_limit_seconds: float = Field(
        default=30.0,
        gt=0,
        description="the wait after a post's 'ratelimited' when Slack names no Retry-After "
        "(a read-back rate-limited without it waits the core's growing wait)",
    )
    readback_window_seconds: float = Field(
        default=120.0,
        ge=0,
        description="after an unknown write, history read completely at least this long after "
        "the write fence, without the post, proves it absent (Slack may show a new message "
        "late); a complete read sooner is repeated. Below the kind's unreadable_for (15 "
        "minutes), after which a read-back gives up as uncertain",
    )
    readback_clock_skew_seconds: float = Field(
        default=120.0,
        ge=0,
        description="the read-back's time range (oldest/latest around the fence's time, a "
        "database time) is widened by this much for Slack's clock",
    )
    readback_page_limit: int = Field(
        default=15,
        ge=1,
        le=999,
        description="messages per history page (Slack allows 15 to apps outside its Marketplace)",
    )
    readback_pages_per_attempt: int = Field(
        default=4,
        ge=1,
        description="history pages one attempt reads; the cursor carries over to the next "
        "attempt (Reread) on the turn's row",
    )

    @field_validator("base_url")
    @classmethod
    def _base_url_is_http(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"{value!r} is not an http(s) URL; use e.g. https://slack.com/api/ "
                "(OUTBOX_SLACK_BASE_URL)"
            )
        return value if value.endswith("/") else value + "/"

    @field_validator("token")
    @classmethod
    def _token_is_one_word(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            secret = value.get_secret_value()
            if not secret.strip() or any(ch.isspace() for ch in secret.strip()):
                raise ValueError(
                    "the token is empty or has spaces in it; set OUTBOX_SLACK_TOKEN to the "
                    "app's bot token (xoxb-...)"
                )
            return SecretStr(secret.strip())
        return value
