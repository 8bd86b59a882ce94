"""A settings section: the base that the core's settings and every package's settings extend.

One section is one ``[outbox.<name>]`` table of the file that ``OUTBOX_CONFIG`` names and one
``OUTBOX_<NAME>_*`` family of environment variables (environment variables win over the
file). Here too: the TOML source, the check of a table's keys against the fields, and the
wording of errors (a mistyped key's nearest field, a URL with its password hidden).
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
from typing import Any, ClassVar, Self

from pydantic import (
    AliasChoices,
    ValidationError,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


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
