"""Issue-tracker settings: ``OUTBOX_ISSUES_*`` environment variables, or the ``[outbox.issues]``
table of the file ``OUTBOX_CONFIG`` names. The token is a ``SecretStr`` and never printed."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from outbox_core.http_settings import HttpProviderSettings

REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
GITHUB_API = "https://api.github.com"


def graphql_url_for(api_url: str) -> str:
    """GitHub's GraphQL endpoint for a REST base URL: ``https://api.github.com/graphql``, and
    for GitHub Enterprise Server (REST under ``/api/v3``) ``https://host/api/graphql``."""
    base = api_url.rstrip("/")
    if base.endswith("/api/v3"):
        return base[: -len("/v3")] + "/graphql"
    return base + "/graphql"


class IssuesSettings(HttpProviderSettings):
    """How the issue kinds reach the tracker. Every field is also ``OUTBOX_ISSUES_<NAME>`` in
    the environment. The URLs' check, the connect timeout and the concurrency's bounds are the
    core's HTTP provider settings (``outbox_core.http_settings``)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_ISSUES_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.issues"
    url_fields: ClassVar[tuple[str, ...]] = ("api_url", "graphql_url")
    url_expected: ClassVar[str] = (
        "an http(s) URL such as https://api.github.com or https://github.example.com/api/v3"
    )
    token_field: ClassVar[str | None] = "token"

    api_url: str = Field(
        default=GITHUB_API,
        description="the REST API v3 base URL: https://api.github.com, or "
        "https://<host>/api/v3 for GitHub Enterprise Server",
    )
    graphql_url: str | None = Field(
        default=None,
        description="unset: <api_url>/graphql on github.com, https://<host>/api/graphql for "
        "an api_url that ends with /api/v3",
    )
    token: SecretStr | None = Field(
        default=None,
        description="a token that may create and edit issues in both repositories; unset: "
        "every attempt ends FAILED with NOT_CONFIGURED",
    )
    repository: str | None = Field(
        default=None,
        description="owner/name of the repository that reports are filed in; unset: NOT_CONFIGURED",
    )
    private_repository: str | None = Field(
        default=None,
        description="owner/name that Make private (TRANSFER_ISSUE) moves an issue to; unset: "
        "make_private() is refused",
    )
    labels: list[str] = Field(
        default_factory=lambda: ["feedback"], description="labels of every filed issue"
    )
    writer_login: str | None = Field(
        default=None,
        description="the login the token writes as; unset: app_slug's '<slug>[bot]', else "
        "asked once with GET /user",
    )
    app_slug: str | None = Field(
        default=None,
        description="for a GitHub App installation token: the App's slug (it writes as "
        "'<slug>[bot]'; GET /user refuses such a token)",
    )
    delete_on_erasure: bool = Field(
        default=False,
        description="after an erasure, delete the issue (GraphQL deleteIssue, needs admin "
        "rights) instead of scrubbing it: GitHub keeps an edited issue's earlier bodies",
    )
    listing_lag_seconds: float = Field(
        default=120.0,
        ge=0.0,
        description="a new issue may be missing from listings for this long: an issue not "
        "found sooner after the write is looked for again, not written again",
    )
    clock_skew_seconds: float = Field(
        default=300.0, ge=0.0, description="listings start this long before the write's time"
    )
    request_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        description="each request's read and write; below the core's fence margin (60 s) with "
        "the listing's pages",
    )
    max_pages: int = Field(
        default=50, ge=1, description="a listing of more pages than this counts as incomplete"
    )

    @field_validator("repository", "private_repository")
    @classmethod
    def _owner_and_name(cls, value: str | None) -> str | None:
        if value is not None and not REPOSITORY.match(value):
            raise ValueError("use owner/name, e.g. 'acme/feedback'")
        return value

    @field_validator("app_slug", "writer_login")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\[\]-]{0,99}$", value):
            raise ValueError("a login or slug of letters, digits, '-' and '_'")
        return value

    @model_validator(mode="after")
    def _repositories_differ(self) -> IssuesSettings:
        private, public = self.private_repository, self.repository
        # GitHub's owner and repository names ignore case: acme/Feedback is acme/feedback.
        if private is not None and public is not None and private.casefold() == public.casefold():
            raise ValueError(
                f"{self.source('private_repository')} names the same repository as "
                f"{self.source('repository')} ({public}); Make private moves the issue to "
                "another repository: name a private one that differs, or unset it"
            )
        return self

    @property
    def effective_graphql_url(self) -> str:
        return self.graphql_url if self.graphql_url is not None else graphql_url_for(self.api_url)

    @property
    def configured_writer(self) -> str | None:
        """The login the token writes as, when the settings say it."""
        if self.writer_login is not None:
            return self.writer_login
        if self.app_slug is not None:
            return f"{self.app_slug}[bot]"
        return None
