"""The plugin host: finds plugins by entry point, calls their hooks, validates what they
register.

No plugin manager exists at import time: :func:`make_plugin_manager` builds one and
:func:`load_plugins` (idempotent, cached per environment) loads the installed plugins.
``OUTBOX_DISABLE_PLUGINS`` (comma-separated names) blocks plugins on purpose;
``OUTBOX_PLUGINS``, when set, is an allowlist (empty: no installed plugin), and a name in it
that no installed plugin has is a :class:`ConfigurationError`. A name is the entry point name
(``email``) or the distribution name (``outbox-email``).

``OUTBOX_APP_PLUGINS`` (comma-separated module names, ``myapp.outbox_plugin``) names modules of
the application that implement hooks like a plugin: each is imported and registered after the
entry points, under its module name, so that an application's own kinds, migration lines and
notices reach every default path (``outbox_core.enqueue``, the CLI, the executor). The
allowlist does not apply to them (they are named on purpose); the blocklist does, by module
name. A module that cannot be imported, or has no hook implementation, stops start-up with an
error naming it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .adapter import ActionAdapter
from .errors import ConfigurationError, PluginLoadError, RegistrationError
from .hookspecs import RegistrationContext
from .migrations import MigrationLine, core_line, ordered
from .person_data import PersonDataCatalog
from .plugin_variables import (
    ALLOW_VARIABLE,
    APP_VARIABLE,
    DISABLE_VARIABLE,
    ENTRY_POINT_GROUP,
    listed,
)
from .registry import KindRegistry


@dataclass(frozen=True, slots=True)
class PluginInfo:
    name: str
    distribution: str
    version: str
    module: str


@dataclass
class PluginHost:
    """What the loaded plugins registered."""

    pluginmanager: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    registry: KindRegistry = field(default_factory=KindRegistry)
    migration_lines: list[MigrationLine] = field(default_factory=list)
    person_data: list[PersonDataCatalog] = field(default_factory=list)
    kind_owner: dict[str, str] = field(default_factory=dict)
    plugin_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each plugin's own state in this host (``RegistrationContext.state``), by plugin name."""

    @property
    def hook(self) -> Any:
        return self.pluginmanager.hook

    def describe(self) -> list[dict[str, Any]]:
        """For ``outbox plugins``: one entry per plugin with its kinds and lines."""
        out = []
        for info in [
            PluginInfo("core", "outbox-core", _version("outbox-core"), "outbox_core"),
            *self.plugins,
        ]:
            kinds = [
                entry.describe()
                for entry in self.registry
                if entry.distribution == info.distribution
            ]
            lines = [
                line.name for line in self.migration_lines if line.distribution == info.distribution
            ]
            out.append(
                {
                    "name": info.name,
                    "distribution": info.distribution,
                    "version": info.version,
                    "module": info.module,
                    "kinds": kinds,
                    "migration_lines": lines,
                }
            )
        return out


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def _names(variable: str) -> set[str] | None:
    names = listed(variable)
    return None if names is None else set(names)


def _import_app_plugin(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise PluginLoadError(
            f"{APP_VARIABLE}: the module {name!r} failed to import: {type(exc).__name__}: "
            f"{exc}. Name a module that this process can import (the outbox command puts "
            f"the current directory on sys.path), or take it out of {APP_VARIABLE}"
        ) from exc


def _check_names(
    entry_points: list[metadata.EntryPoint],
    apps: list[str],
    disabled: set[str],
    allowed: set[str] | None,
) -> None:
    """A name in OUTBOX_PLUGINS that names no installed plugin is an error: the plugin meant
    (a typo, ``emial``) would not load, and an executor would serve none of its kinds. A name in
    OUTBOX_DISABLE_PLUGINS that names none blocks nothing, and is a warning,
    ``plugins.name.unknown`` (a blocklist shared by builds may name a plugin this one lacks)."""
    from .settings_section import nearest, warn_once

    known = {ep.name for ep in entry_points} | set(apps)
    known |= {ep.dist.name for ep in entry_points if ep.dist is not None}
    installed = ", ".join(sorted(known)) or "none"
    unknown = sorted((allowed or set()) - known)
    if unknown:
        named = "; ".join(f"{name!r}{nearest(name, known)}" for name in unknown)
        raise ConfigurationError(
            f"{ALLOW_VARIABLE}: no installed plugin is named {named}; installed: {installed} (a "
            f"plugin's entry point or distribution name; {ALLOW_VARIABLE}= with nothing after "
            "it loads none)"
        )
    for name in sorted(disabled - known):
        warn_once(
            "plugins.name.unknown",
            variable=DISABLE_VARIABLE,
            plugin=name,
            detail=f"no installed plugin has this name{nearest(name, known)}; installed: "
            f"{installed}",
        )


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def build_host(
    extra_plugins: Iterable[tuple[str, ModuleType | object]] = (),
    *,
    use_entry_points: bool = True,
    app_plugins: Iterable[str] | None = None,
) -> PluginHost:
    """Load the installed plugins, the modules ``app_plugins`` names (by default those of
    ``OUTBOX_APP_PLUGINS``) and ``extra_plugins`` ((name, module or object) pairs, for tests),
    and collect what they register."""
    pm = make_plugin_manager()
    host = PluginHost(pluginmanager=pm)
    disabled = _names(DISABLE_VARIABLE) or set()
    allowed = _names(ALLOW_VARIABLE)
    apps = list(app_plugins) if app_plugins is not None else listed(APP_VARIABLE) or []
    loaded: list[tuple[PluginInfo, object]] = []
    entry_points = _entry_points() if use_entry_points else []
    _check_names(entry_points, apps, disabled, allowed if use_entry_points else None)
    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "(unknown)"
        version = ep.dist.version if ep.dist is not None else "unknown"
        names = {ep.name, dist}
        if names & disabled or (allowed is not None and not names & allowed):
            host.blocked.append(ep.name)
            continue
        try:
            module = ep.load()
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {ep.name!r} from {dist} {version} failed to load ({ep.value}): "
                f"{type(exc).__name__}: {exc}. Fix or uninstall it, or start without it with "
                f"{DISABLE_VARIABLE}={ep.name}"
            ) from exc
        loaded.append((PluginInfo(ep.name, dist, version, ep.value), module))
    app_names: set[str] = set()
    for name in dict.fromkeys(apps):
        if name in disabled:
            host.blocked.append(name)
            continue
        loaded.append((PluginInfo(name, name, "", name), _import_app_plugin(name)))
        app_names.add(name)
    for name, module in extra_plugins:
        module_name = getattr(module, "__name__", type(module).__name__)
        loaded.append((PluginInfo(name, name, "", module_name), module))

    for info, module in loaded:
        try:
            pm.register(module, name=info.name)
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {info.name!r} from {info.distribution} {info.version}: {exc}"
            ) from exc
        if info.name in app_names and not pm.get_hookcallers(module):
            raise PluginLoadError(
                f"{APP_VARIABLE}: the module {info.name!r} registers nothing: it has no "
                "@outbox_core.hookimpl function (outbox_register_kinds, "
                "outbox_register_migrations, ...). Name the module that holds them"
            )
        host.plugins.append(info)

    by_module = {info.name: info for info, _ in loaded}

    def who(impl: pluggy.HookImpl) -> PluginInfo:
        return by_module.get(impl.plugin_name, PluginInfo(impl.plugin_name, "(unknown)", "", ""))

    def context_for(info: PluginInfo) -> RegistrationContext:
        return RegistrationContext(
            plugin=info.name,
            distribution=info.distribution,
            version=info.version,
            pluginmanager=pm,
            state=host.plugin_state.setdefault(info.name, {}),
        )

    _call_each(
        pm.hook.outbox_add_hookspecs,
        who,
        lambda info: {"pluginmanager": pm, "context": context_for(info)},
    )

    lines: list[MigrationLine] = [core_line()]

    def kinds_for(info: PluginInfo) -> dict[str, Any]:
        def register(adapter: type[ActionAdapter]) -> None:
            entry = host.registry.register(
                adapter, distribution=info.distribution, version=info.version
            )
            host.kind_owner[entry.kind] = info.distribution

        return {"register": register, "context": context_for(info)}

    def lines_for(info: PluginInfo) -> dict[str, Any]:
        def register(line: MigrationLine) -> None:
            if not isinstance(line, MigrationLine):
                raise RegistrationError(f"register() takes a MigrationLine, got {line!r}")
            if line.distribution == "(application)":
                line = MigrationLine(line.name, line.package, line.directory, info.distribution)
            lines.append(line)

        return {"register": register, "context": context_for(info)}

    def person_data_for(info: PluginInfo) -> dict[str, Any]:
        def register(catalog: PersonDataCatalog) -> None:
            if not isinstance(catalog, PersonDataCatalog):
                raise RegistrationError(
                    f"{info.distribution}: a person-data catalog has `name` and "
                    f"`async erase(conn, subject_account_id)`; got {catalog!r}"
                )
            host.person_data.append(catalog)

        return {"register": register, "context": context_for(info)}

    _call_each(pm.hook.outbox_register_kinds, who, kinds_for)
    _call_each(pm.hook.outbox_register_migrations, who, lines_for)
    _call_each(pm.hook.outbox_register_person_data, who, person_data_for)
    host.migration_lines = ordered(lines)
    return host


def _call_each(
    hook: Any,
    who: Callable[[pluggy.HookImpl], PluginInfo],
    kwargs_for: Callable[[PluginInfo], dict[str, Any]],
) -> None:
    """Call one hook plugin by plugin, so a failure names the plugin that failed."""
    for impl in hook.get_hookimpls():  # registration order, as the hookspecs promise
        info = who(impl)
        try:
            kwargs = kwargs_for(info)
            impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs})
        except (RegistrationError, PluginLoadError) as exc:
            raise type(exc)(
                f"plugin {info.name!r} ({info.distribution} {info.version}): {exc}"
            ) from exc
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {info.name!r} from {info.distribution} {info.version} failed in "
                f"{hook.name}: {type(exc).__name__}: {exc}. Start without it with "
                f"{DISABLE_VARIABLE}={info.name}"
            ) from exc


_lock = threading.Lock()
_cache: dict[tuple[str | None, str | None, str | None], PluginHost] = {}


def load_plugins() -> PluginHost:
    """The installed plugins and the modules of ``OUTBOX_APP_PLUGINS``, loaded once per process
    and per value of the three variables."""
    key = (
        os.environ.get(DISABLE_VARIABLE),
        os.environ.get(ALLOW_VARIABLE),
        os.environ.get(APP_VARIABLE),
    )
    with _lock:
        host = _cache.get(key)
        if host is None:
            host = build_host()
            _cache[key] = host
        return host


def forget_loaded_plugins() -> None:
    """Drop the cache (tests that install or block plugins call this)."""
    with _lock:
        _cache.clear()
