"""SMTP settings: ``OUTBOX_EMAIL_*`` environment variables, or the ``[outbox.email]`` table of
the file ``OUTBOX_CONFIG`` names. The password is a ``SecretStr`` and never printed."""

from __future__ import annotations

import re
from email.headerregistry import Address
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from outbox_core import SectionSettings

from .errors import InvalidMail
from .notices import parse_address

TlsMode = Literal["implicit", "starttls", "none"]
_DOMAIN = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
DEFAULT_PORTS: dict[str, int] = {"implicit": 465, "starttls": 587, "none": 25}


class EmailSettings(SectionSettings):
    """How the ``EMAIL`` adapter reaches its relay. Every field is also
    ``OUTBOX_EMAIL_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_EMAIL_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.email"

    host: str = Field(default="localhost", description="the SMTP relay (smarthost)")
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="unset: 465 for implicit TLS, 587 for STARTTLS, 25 for none",
    )
    tls: TlsMode = Field(
        default="starttls",
        description="implicit (TLS from the first byte), starttls (required, never skipped), "
        "or none (a relay on loopback or a private network only)",
    )
    username: str | None = Field(default=None, description="AUTH user; unset: no AUTH")
    password: SecretStr | None = Field(default=None, description="AUTH password")
    sender: str | None = Field(
        default=None,
        description="From and envelope sender, 'Example <noreply@example.com>'; unset: every "
        "attempt ends FAILED with NOT_CONFIGURED",
    )
    message_id_domain: str | None = Field(
        default=None, description="right-hand side of the Message-ID; unset: the sender's domain"
    )
    local_hostname: str | None = Field(
        default=None, description="the name sent with EHLO; unset: this host's FQDN"
    )
    validate_certs: bool = Field(default=True, description="verify the relay's certificate")
    cert_bundle: str | None = Field(
        default=None, description="CA file for a relay with a private certificate authority"
    )
    connect_timeout_seconds: float = Field(
        default=10.0, gt=0, description="TCP connect, TLS handshake and the relay's greeting"
    )
    command_timeout_seconds: float = Field(
        default=20.0, gt=0, description="the wait for each reply (EHLO, AUTH, MAIL, ..., DATA)"
    )
    send_timeout_seconds: float = Field(
        default=45.0,
        gt=0,
        description="the whole transaction after the write fence; below the core's "
        "fence_margin_seconds (60), since the provider call must end within the lease (else "
        "an executor stops the EMAIL kind, or refuses to open with strict start-up)",
    )
    reuse_connections: bool = Field(
        default=True, description="keep connections open for the next message"
    )
    max_connections: int = Field(default=8, ge=1, le=1000, description="connections per executor")
    max_messages_per_connection: int = Field(
        default=100, ge=1, description="then the connection is closed and a new one opened"
    )
    idle_seconds: float = Field(
        default=30.0, gt=0, description="an idle pooled connection is closed after this long"
    )

    @field_validator("sender")
    @classmethod
    def _sender_is_an_address(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_address(value, "sender")
            except InvalidMail as exc:
                raise ValueError(str(exc).removeprefix("sender: ")) from None
        return value

    @field_validator("message_id_domain")
    @classmethod
    def _domain_is_plain(cls, value: str | None) -> str | None:
        if value is not None and not _DOMAIN.match(value):
            raise ValueError("a plain domain name such as 'mail.example.com'")
        return value

    @model_validator(mode="after")
    def _password_needs_user(self) -> EmailSettings:
        if self.password is not None and self.username is None:
            raise ValueError("password is set but username is not; set OUTBOX_EMAIL_USERNAME")
        return self

    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORTS[self.tls]

    @property
    def sender_address(self) -> Address | None:
        return None if self.sender is None else parse_address(self.sender, "sender")

    @property
    def effective_message_id_domain(self) -> str | None:
        if self.message_id_domain is not None:
            return self.message_id_domain
        sender = self.sender_address
        return None if sender is None else sender.domain
