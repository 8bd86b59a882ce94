"""Configuration: ``OUTBOX_*`` environment variables, optionally a TOML file.

``OUTBOX_CONFIG`` names the TOML file (its ``[outbox]`` table holds the same keys as the
environment variables, lower-case, without the prefix). Environment variables win over the
file. Secrets are ``SecretStr`` and never printed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from .settings_section import SectionSettings, hide_url
from .sqlfiles import SCHEMA_NAME

MULTI_HOST_ATTRS = ("read-write", "primary")
"""The ``target_session_attrs`` a URL that names several hosts must have: only a primary."""


class OutboxSettings(SectionSettings):
    """The core's settings. Every field is also ``OUTBOX_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore")

    database_url: SecretStr | None = Field(
        default=None, description="postgresql:// URL of the server; unset: an embedded server"
    )
    schema_name: str = Field(
        default="outbox",
        validation_alias=AliasChoices("schema_name", "OUTBOX_SCHEMA", "schema"),
        description="the PostgreSQL schema that holds outbox's tables",
    )
    lease_seconds: float = Field(default=300.0, gt=0.0, description="length of a claim's lease")
    fence_margin_seconds: float = Field(
        default=60.0, ge=0.0, description="begin_write() refuses with less lease than this left"
    )
    concurrency: int = Field(default=100, ge=1, description="attempts running at once")
    kind_concurrency: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="attempts running at once per kind, e.g. {EMAIL=4}",
        examples=[{"EMAIL": 4}],
    )
    claim_batch: int = Field(default=500, ge=1, le=10_000, description="lanes per claim")
    poll_seconds: float = Field(
        default=2.0, gt=0.0, description="fallback poll when no notification arrives"
    )
    retention_days: float = Field(default=30.0, gt=0.0, description="keep ended actions this long")
    maintenance_seconds: float = Field(
        default=10.0, gt=0.0, description="how often expiry, retention and gauges run"
    )
    blocked_lanes_seconds: float = Field(
        default=60.0,
        gt=0.0,
        description=(
            "how often the gauges that pass over every live action are counted (blocked "
            "lanes, waiting and proposed actions)"
        ),
    )
    progress_seconds: float = Field(
        default=60.0,
        gt=0.0,
        description="how often a busy executor logs executor.progress (nothing when idle)",
    )
    shutdown_seconds: float = Field(
        default=30.0, ge=0.0, description="on SIGTERM, how long running attempts may finish"
    )
    pool_size: int = Field(default=4, ge=2, le=100, description="database connections per executor")
    startup_wait_seconds: float = Field(
        default=60.0,
        ge=0.0,
        description=(
            "outbox run: how long to wait for a database that is unreachable or starting up "
            "(a login refused or a database missing fails at once)"
        ),
    )
    strict_startup: bool = Field(
        default=False,
        description="an executor refuses to open when a kind it serves cannot run with these "
        "settings (its adapter cannot be built); unset: that kind is stopped, the others run",
    )

    @field_validator("schema_name")
    @classmethod
    def _schema_is_plain(cls, value: str) -> str:
        if not SCHEMA_NAME.match(value):
            raise ValueError(
                "use a lower-case name of letters, digits and underscores (at most 56 "
                "characters, not starting with a digit), e.g. 'outbox'"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _url_is_postgres(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        text = value.get_secret_value().strip()
        if not text:
            return None
        if "://" in text and not text.startswith(("postgresql://", "postgres://")):
            raise ValueError("expected a URL that starts with postgresql://")
        from psycopg.conninfo import conninfo_to_dict
        from psycopg.errors import ProgrammingError

        try:
            params = conninfo_to_dict(text)
        except ProgrammingError as exc:
            # libpq's message names the bad part, and for a URI quotes it whole: with the
            # password. It is said without the URL.
            raise ValueError(
                f"malformed ({hide_url(str(exc).strip(), text)}); expected a URL such as "
                "postgresql://user:password@host:5432/dbname"
            ) from None
        hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
        attrs = params.get("target_session_attrs")
        if len(hosts) > 1 and attrs not in MULTI_HOST_ATTRS:
            # libpq takes the first host that answers, a standby too: LISTEN and every write
            # of the executor fail there (issue 35; docs/operations.md, "High availability").
            raise ValueError(
                f"names {len(hosts)} hosts with target_session_attrs={attrs or 'any'}: the "
                "first to answer could be a standby; add target_session_attrs=read-write "
                "(?target_session_attrs=read-write), so that only the primary is taken"
            )
        return SecretStr(text)

    @model_validator(mode="after")
    def _lease_outlasts_margin(self) -> OutboxSettings:
        if self.lease_seconds <= self.fence_margin_seconds:
            raise ValueError(
                f"lease_seconds ({self.lease_seconds}) must be longer than fence_margin_seconds "
                f"({self.fence_margin_seconds}): no attempt could ever pass its write fence"
            )
        return self

    def dsn(self) -> str | None:
        return None if self.database_url is None else self.database_url.get_secret_value()

    @property
    def batches_in_flight(self) -> int:
        """How many batches of endings, and as many of fences, an executor writes at once.

        The server works on some while the executor reads the answer to another and runs
        what it chained. Each write holds a pool connection: one batch below 4 connections,
        two at 4, three from 5, so that endings alone leave two connections to the claim
        loop, the maintenance and the adapters' lease transactions (with fences as well, those
        wait their turn for a connection). More than three cut the batches smaller than they
        pay for (docs/benchmarks.md, "What was tried")."""
        return 1 if self.pool_size < 4 else min(3, self.pool_size - 2)
