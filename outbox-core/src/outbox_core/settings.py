"""Configuration: ``OUTBOX_*`` environment variables, optionally a TOML file.

``OUTBOX_CONFIG`` names the TOML file (its ``[outbox]`` table holds the same keys as the
environment variables, lower-case, without the prefix). Environment variables win over the
file. Secrets are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .sqlfiles import SCHEMA_NAME


def config_file_table(section: str = "outbox") -> dict[str, Any]:
    """The ``[section]`` table of the file that ``OUTBOX_CONFIG`` names ({} when unset)."""
    path = os.environ.get("OUTBOX_CONFIG")
    if not path:
        return {}
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text("utf-8"))
    except FileNotFoundError:
        from .errors import ConfigurationError

        raise ConfigurationError(f"OUTBOX_CONFIG={path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        from .errors import ConfigurationError

        raise ConfigurationError(f"OUTBOX_CONFIG={path}: not valid TOML ({exc})") from None
    table: Any = data
    for part in section.split("."):
        table = table.get(part, {}) if isinstance(table, dict) else {}
    return dict(table) if isinstance(table, dict) else {}


_URL_CREDENTIALS = re.compile(r"(://)[^/@\s]*@")
_PASSWORD_PARAMETER = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def hide_url(message: str, url: str) -> str:
    """``message`` (libpq's, about ``url``) without the URL and without any user and password
    it would still show (``postgresql://user:secret@...``, ``password=secret``)."""
    if url:
        message = message.replace(url, "(the database URL)")
        password = _url_password(url)
        if password:
            # libpq quotes the token it could not read: a piece of the password ("pw%zz").
            message = _QUOTED.sub(
                lambda quoted: (
                    '"***"'
                    if quoted.group(1) in password or password in quoted.group(1)
                    else quoted.group(0)
                ),
                message,
            )
    message = _URL_CREDENTIALS.sub(r"\1***@", message)
    return _PASSWORD_PARAMETER.sub(r"\1***", message)


_QUOTED = re.compile(r'"([^"]+)"')


def _url_password(url: str) -> str:
    """The password of a ``postgresql://user:password@host`` URL, as written ("" if none)."""
    _, found, rest = url.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0] if found else ""
    return authority.rpartition("@")[0].partition(":")[2]


def validation_problems(exc: ValidationError) -> str:
    """A validation error as one line, ``field: message; ...``, without the input values (a
    value may be a secret)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors(include_input=False, include_url=False)
    )


_warned: set[str] = set()


def warn_once(event_name: str, **fields: Any) -> None:
    """A configuration warning, logged once per process (settings are loaded many times)."""
    key = f"{event_name} {sorted(fields.items())}"
    if key in _warned:
        return
    _warned.add(key)
    from .observability import event

    event(event_name, level=logging.WARNING, **fields)


def nearest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _field_keys(settings_cls: type[BaseSettings], name: str) -> list[str]:
    """The keys of a section's TOML table that set the field ``name``: the field's name and
    its lower-case aliases (``schema`` for ``schema_name``)."""
    info = settings_cls.model_fields[name]
    alias = info.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    return [name, *(c for c in choices if isinstance(c, str) and c.islower() and c != name)]


def _table_keys(settings_cls: type[BaseSettings]) -> set[str]:
    """The keys a section's TOML table may hold."""
    return {key for name in settings_cls.model_fields for key in _field_keys(settings_cls, name)}


def plugin_table_names(*, import_app_plugins: bool = False) -> set[str]:
    """The ``[outbox.<name>]`` tables something installed may read: each installed plugin's
    entry point name, the top package of each module ``OUTBOX_APP_PLUGINS`` names
    (``[outbox.myapp]`` for ``myapp.outbox_plugin``), and every section of the settings classes
    imported so far. With ``import_app_plugins`` the application's modules are imported first
    (as loading the plugins does), so that the sections they declare are known too."""
    from importlib import metadata

    from .plugin_variables import APP_VARIABLE, ENTRY_POINT_GROUP, listed

    names = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    modules = listed(APP_VARIABLE) or []
    names.update(module.split(".")[0] for module in modules)
    if import_app_plugins:
        import contextlib
        import importlib

        for module in modules:
            # A module that fails to import is the plugin host's to report, in its own words.
            with contextlib.suppress(Exception):
                importlib.import_module(module)
    todo: list[type[SectionSettings]] = [SectionSettings]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        section = cls.toml_section.split(".")
        if len(section) > 1 and section[0] == "outbox":
            names.add(section[1])
    return names


def check_config_table(settings_cls: type[SectionSettings], table: dict[str, Any]) -> None:
    """Refuse a key of ``settings_cls``'s table that no field reads, naming the nearest known
    key (a typo, ``lease_second``, would otherwise be ignored in silence). In the core's
    ``[outbox]`` table a sub-table is a plugin's ``[outbox.<name>]``: one that no installed
    plugin reads is a warning (``config.table.unknown``), and so is a file without the
    ``[outbox]`` table (``config.table.missing``). Environment variables are not checked:
    other programs share the ``OUTBOX_`` prefix."""
    from .errors import ConfigurationError

    path = os.environ.get("OUTBOX_CONFIG", "")
    section = settings_cls.toml_section
    known = _table_keys(settings_cls)
    tables = {key for key, value in table.items() if isinstance(value, dict)}
    unknown = sorted(key for key in table if key not in known and key not in tables)
    if unknown:
        raise ConfigurationError(
            f"OUTBOX_CONFIG={path}: [{section}] has no key "
            + "; no key ".join(f"{key!r}{nearest(key, known)}" for key in unknown)
            + f"; its keys are {', '.join(sorted(known))}"
        )
    if section != "outbox":
        return
    if not table:
        warn_once(
            "config.table.missing",
            file=path,
            detail="the file has no [outbox] table (or an empty one): outbox reads nothing from it",
        )
    plugins = plugin_table_names()
    if tables - plugins and os.environ.get("OUTBOX_APP_PLUGINS"):
        plugins = plugin_table_names(import_app_plugins=True)
    for name in sorted(tables - plugins):
        warn_once(
            "config.table.unknown",
            file=path,
            table=f"outbox.{name}",
            detail="no installed plugin reads it"
            + nearest(f"outbox.{name}", (f"outbox.{plugin}" for plugin in plugins)),
        )


class _TomlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], section: str) -> None:
        super().__init__(settings_cls)
        self._table = config_file_table(section)
        if issubclass(settings_cls, SectionSettings) and os.environ.get("OUTBOX_CONFIG"):
            check_config_table(settings_cls, self._table)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._table.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        names = _table_keys(self.settings_cls)
        return {key: value for key, value in self._table.items() if key in names}


class SectionSettings(BaseSettings):
    """Base of every package's settings: environment first, then the TOML table.

    A plugin declares ``model_config = SettingsConfigDict(env_prefix="OUTBOX_EMAIL_")`` and
    ``toml_section = "outbox.email"``. However a section is built (``load()``, the class
    called with values, the core or a plugin), a wrong value is a
    :class:`~outbox_core.ConfigurationError` of one line naming where it was set (the variable,
    or the file's table and key), what is wrong with it and what is accepted; never the value,
    which may be a secret.
    """

    toml_section: ClassVar[str] = "outbox"
    # A value may be a secret: pydantic's own message (str(ValidationError)) never repeats it.
    # Merged into each subclass's model_config.
    model_config = SettingsConfigDict(hide_input_in_errors=True)

    def __init__(self, *args: Any, **values: Any) -> None:
        from pydantic_settings import SettingsError

        from .errors import ConfigurationError

        try:
            super().__init__(*args, **values)
        except ValidationError as exc:
            raise ConfigurationError(type(self).problems(exc)) from None
        except SettingsError as exc:
            found = re.search(r'field "(\w+)"', str(exc))
            field = found.group(1) if found else ""
            raise ConfigurationError(type(self).unparsable(field)) from None

    @classmethod
    def load(cls, **values: Any) -> Self:
        """The settings from the environment and the file (``values`` win over both), or a
        :class:`~outbox_core.ConfigurationError` of one line naming each setting that is wrong
        and what it should be (the same as calling the class)."""
        return cls(**values)

    @classmethod
    def problems(cls, exc: ValidationError) -> str:
        """A validation error as one line: ``OUTBOX_EMAIL_TLS: Input should be 'implicit',
        'starttls' or 'none'; ...``, each problem under the setting's name, without the value."""
        return "; ".join(
            f"{cls.source(*error['loc'])}: {error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors(include_input=False, include_url=False)
        )

    @classmethod
    def unparsable(cls, field: str) -> str:
        """The message for a list or table setting that is not valid JSON, with an example of
        what it takes."""
        info = cls.model_fields.get(field)
        example = info.examples[0] if info is not None and info.examples else None
        if example is None:
            annotation = info.annotation if info is not None else None
            example = {"name": 1} if typing.get_origin(annotation) is dict else ["name"]
        shape = "an object" if isinstance(example, dict) else "a list"
        return (
            f"{cls.source(field) if field else cls.variable()}: cannot be parsed; write {shape} in "
            f"JSON, e.g. '{json.dumps(example)}'"
        )

    @classmethod
    def variable(cls, *field: object) -> str:
        """The environment variable of a field (``OUTBOX_EMAIL_SEND_TIMEOUT_SECONDS``), or with
        no field the section's prefix (``OUTBOX_EMAIL``): what an error names, so that the
        operator knows what to set. A field with an upper-case alias is named by it
        (``OUTBOX_SCHEMA``); a part below a field (a key of a table, the index in a list) is
        added in brackets: ``OUTBOX_KIND_CONCURRENCY[EMAIL]``."""
        prefix = str(cls.model_config.get("env_prefix") or "")
        if not field:
            return prefix.rstrip("_")
        name, *below = (str(part) for part in field)
        info = cls.model_fields.get(name)
        alias = info.validation_alias if info is not None else None
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        upper = [c for c in choices if isinstance(c, str) and c.isupper() and c.startswith(prefix)]
        variable = upper[0] if upper else f"{prefix}{name.upper()}"
        return variable + "".join(f"[{part}]" for part in below)

    @classmethod
    def source(cls, *field: object) -> str:
        """Where a field's value was set: its environment variable when that is set (or the
        field is not in the file), else the key of the file's table (``outbox.toml [outbox.email]
        tls``). A problem of the section as a whole is named by its prefix."""
        variable = cls.variable(*field)
        if not field or variable.split("[")[0] in os.environ or not os.environ.get("OUTBOX_CONFIG"):
            return variable
        name = str(field[0])
        table = config_file_table(cls.toml_section)
        key = next((key for key in _field_keys(cls, name) if key in table), None)
        if key is None:
            return variable
        below = "".join(f"[{part}]" for part in field[1:])
        return f"{os.environ['OUTBOX_CONFIG']} [{cls.toml_section}] {key}{below}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls, cls.toml_section))


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
