"""The settings base of an HTTP provider's package (outbox-draft's model proxy, outbox-issues'
tracker): what every such package loads and checks the same way, on top of
:class:`~outbox_core.SectionSettings` (the environment, the TOML table, one-line errors naming
the package's own variable):

- its base URLs, named in ``url_fields``: an ``http(s)`` URL with a host, kept without a
  trailing ``/``; anything else is refused saying what it takes (``url_expected``);
- ``connect_timeout_seconds`` and ``request_timeout_seconds`` (both above 0), the two parts of
  one request that the adapter's ``provider_timeout_settings`` sums against the fence margin;
- ``max_concurrency``, the requests in flight per executor;
- the token, named in ``token_field``, sent as ``Authorization: Bearer <token>``
  (:meth:`HttpProviderSettings.bearer`); unset, no header.

A package redeclares a field only where its default or its description differs (the model
proxy's longer answer time), and keeps its own fields and checks beside these.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from .settings_section import SectionSettings

__all__ = ["HttpProviderSettings", "bearer", "http_url"]


def http_url(value: str, expected: str = "an http(s) URL such as https://api.example.com") -> str:
    """``value`` without its trailing ``/`` when it is an http(s) URL with a host; else a
    ValueError ``expected <expected>``, which the section's error puts under the setting's
    variable (``OUTBOX_ISSUES_API_URL: expected an http(s) URL such as ...``)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"expected {expected}")
    return value.rstrip("/")


def bearer(token: SecretStr | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}``, or ``{}`` without a token."""
    if token is None:
        return {}
    return {"Authorization": f"Bearer {token.get_secret_value()}"}


class HttpProviderSettings(SectionSettings):
    """Base of an HTTP provider's settings (see the module's docstring). A subclass sets
    ``model_config`` (its ``env_prefix``), ``toml_section``, ``url_fields``, ``url_expected``
    and ``token_field``."""

    url_fields: ClassVar[tuple[str, ...]] = ()
    """The fields that hold a base URL (each checked by :func:`http_url`; None stays unset)."""
    url_expected: ClassVar[str] = "an http(s) URL such as https://api.example.com"
    """What a wrong URL's error says the setting takes, after ``expected``: the shape of this
    provider's URL and an example of it."""
    token_field: ClassVar[str | None] = None
    """The field that holds the token (a ``SecretStr``), sent as a bearer token."""

    connect_timeout_seconds: float = Field(default=5.0, gt=0, description="TCP and TLS connect")
    request_timeout_seconds: float = Field(
        default=20.0, gt=0, description="each request's read and write"
    )
    max_concurrency: int = Field(
        default=8, ge=1, le=1000, description="requests in flight per executor"
    )

    @field_validator("*")
    @classmethod
    def _base_urls(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name in cls.url_fields and value is not None:
            return http_url(str(value), cls.url_expected)
        return value

    def bearer(self) -> dict[str, str]:
        """``{"Authorization": "Bearer <token>"}``, or ``{}`` without a token."""
        token = getattr(self, self.token_field) if self.token_field else None
        return bearer(token if isinstance(token, SecretStr) else None)
