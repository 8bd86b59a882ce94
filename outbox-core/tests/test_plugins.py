"""The plugin host: entry points, blocking, allowlists, broken plugins, registrations."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from outbox_core import ActionAdapter, Done, RegistrationError, hookspecs
from outbox_core.errors import PluginLoadError
from outbox_core.plugins import build_host, forget_loaded_plugins, load_plugins
from outbox_core.registry import KindRegistry

from .kinds import NoopAdapter


def install_fake_distribution(
    root: Path, name: str, module: str, source: str | None, version: str = "1.2.3"
) -> None:
    """A distribution on sys.path: its metadata, its entry point, and (optionally) its module."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    entry = name.removeprefix("outbox-")
    (info / "entry_points.txt").write_text(f"[outbox_core.plugins]\n{entry} = {module}\n")
    if source is not None:
        (root / f"{module}.py").write_text(textwrap.dedent(source))


GOOD_PLUGIN = """
    from pydantic import BaseModel
    from outbox_core import ActionAdapter, ActionVariants, Done, hookimpl

    class Body(BaseModel):
        n: int

    class FakeAdapter(ActionAdapter):
        kind = "FAKE_KIND"
        instance_level = True

        @classmethod
        def variants(cls):
            return ActionVariants.one(Body)

        async def execute(self, attempt):
            return Done()

    @hookimpl
    def outbox_register_kinds(register):
        register(FakeAdapter)
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OUTBOX_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("OUTBOX_PLUGINS", raising=False)
    forget_loaded_plugins()
    yield tmp_path
    forget_loaded_plugins()


def test_an_installed_plugin_is_found_by_its_entry_point(site: Path) -> None:
    install_fake_distribution(site, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)
    host = load_plugins()
    assert "FAKE_KIND" in host.registry
    listed = {p["distribution"]: p for p in host.describe()}
    assert listed["outbox-fake"]["version"] == "1.2.3"
    assert [k["kind"] for k in listed["outbox-fake"]["kinds"]] == ["FAKE_KIND"]
    assert load_plugins() is host  # loaded once


def test_a_plugin_that_fails_to_import_stops_start_up_naming_its_distribution(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_distribution(
        site,
        "outbox-broken",
        "outbox_broken_plugin",
        "import no_such_module_anywhere\n",
        version="0.9.1",
    )
    with pytest.raises(
        PluginLoadError,
        match=r"plugin 'broken' from outbox-broken 0\.9\.1 failed to load .*No module named 'no_such_module_anywhere'.*OUTBOX_DISABLE_PLUGINS=broken",
    ):
        load_plugins()
    monkeypatch.setenv("OUTBOX_DISABLE_PLUGINS", "broken")
    host = load_plugins()
    assert host.blocked == ["broken"]


def test_a_plugin_can_be_blocked_by_its_distribution_name_or_left_out_of_an_allowlist(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_distribution(site, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)
    monkeypatch.setenv("OUTBOX_DISABLE_PLUGINS", "outbox-fake")
    assert "FAKE_KIND" not in load_plugins().registry
    monkeypatch.delenv("OUTBOX_DISABLE_PLUGINS")
    monkeypatch.setenv("OUTBOX_PLUGINS", "")  # an empty allowlist lets no installed plugin in
    assert "FAKE_KIND" not in load_plugins().registry
    monkeypatch.setenv("OUTBOX_PLUGINS", "fake")
    assert "FAKE_KIND" in load_plugins().registry


def test_a_plugin_whose_hook_raises_is_named(site: Path) -> None:
    install_fake_distribution(
        site,
        "outbox-angry",
        "outbox_angry_plugin",
        """
        from outbox_core import hookimpl

        @hookimpl
        def outbox_register_kinds(register):
            raise RuntimeError("boom")
    """,
    )
    with pytest.raises(
        PluginLoadError,
        match="plugin 'angry' from outbox-angry 1.2.3 failed in outbox_register_kinds: RuntimeError: boom",
    ):
        load_plugins()


def test_a_kind_registered_twice_names_both_registrants() -> None:
    class Again(NoopAdapter):
        pass

    registry = KindRegistry()
    registry.register(NoopAdapter, distribution="outbox-first", version="1.0")
    with pytest.raises(
        RegistrationError,
        match="kind TEST_NOOP is registered twice: by NoopAdapter from outbox-first 1.0 and by .*Again from outbox-second 2.0",
    ):
        registry.register(Again, distribution="outbox-second", version="2.0")


def test_an_adapter_without_variants_is_refused_at_registration() -> None:
    class Silent(ActionAdapter):
        kind = "TEST_SILENT"

        async def execute(self, attempt: Any) -> Done:
            return Done()

    with pytest.raises(RegistrationError, match=r"Silent declares no variants\(\)"):
        KindRegistry().register(Silent)


def _sync_ended(self: Any, conn: Any, action: Any) -> None:
    pass


def _sync_rescheduled(self: Any, conn: Any, action: Any, result: Any) -> None:
    pass


def _sync_execute(self: Any, attempt: Any) -> Done:
    return Done()


# (what is wrong, the class attributes that make it so, what the error names)
MALFORMED = [
    ("ended-without-async", {"ended": _sync_ended}, r"Odd\.ended must be an `async def`"),
    (
        "rescheduled-without-async",
        {"rescheduled": _sync_rescheduled},
        r"Odd\.rescheduled must be an `async def`",
    ),
    ("execute-without-async", {"execute": _sync_execute}, r"Odd\.execute must be an `async def`"),
    ("max-concurrency-text", {"max_concurrency": "4"}, r"Odd\.max_concurrency is '4'"),
    ("max-concurrency-zero", {"max_concurrency": 0}, r"Odd\.max_concurrency is 0"),
    ("at-most-once-text", {"at_most_once": "yes"}, r"Odd\.at_most_once is str"),
    ("retry-base-seconds", {"retry_base": 5}, r"Odd\.retry_base is int; it must be a timedelta"),
    ("no-attempts", {"default_max_attempts": 0}, r"Odd\.default_max_attempts must be"),
    ("stop-reasons-list", {"stop_reasons": ["GONE"]}, r"Odd\.stop_reasons must be a frozenset"),
]


@pytest.mark.parametrize(("name", "attributes", "error"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_an_adapter_class_with_a_wrong_declaration_is_refused_at_registration(
    name: str, attributes: dict[str, Any], error: str
) -> None:
    """What the executor trusts without looking again is checked once, at registration: an
    ``ended`` without ``async`` ran, failed at its await, and rolled its ending back on every
    try; a text max_concurrency stopped the claim loop."""
    adapter = type("Odd", (NoopAdapter,), attributes)
    with pytest.raises(RegistrationError, match=error):
        KindRegistry().register(adapter, distribution="outbox-odd", version="1.0")


async def test_a_built_adapter_with_a_wrong_max_concurrency_is_refused_by_name(
    outbox_db: Any,
) -> None:
    """max_concurrency may be set by the built instance from its settings: checked there."""
    from outbox_core import AdapterContractError

    class FromSettings(NoopAdapter):
        kind = "TEST_FROM_SETTINGS"

        @classmethod
        def build(cls, settings: Any) -> FromSettings:
            built = cls()
            built.max_concurrency = "8"  # type: ignore[assignment]  # a setting left as text
            return built

    outbox_db.registry = KindRegistry()
    outbox_db.register_kind(FromSettings)
    executor = outbox_db.executor()
    with pytest.raises(
        AdapterContractError, match=r"FromSettings \(built\)\.max_concurrency is '8'"
    ):
        executor.adapter("TEST_FROM_SETTINGS")


@pytest.mark.parametrize("kind", ["lower", "WITH SPACE", "", "9STARTS_WITH_DIGIT"])
def test_a_kind_name_is_an_upper_case_identifier(kind: str) -> None:
    adapter = type("Odd", (NoopAdapter,), {"kind": kind})
    with pytest.raises(RegistrationError, match="must be an upper-case name"):
        KindRegistry().register(adapter)


def test_application_plugins_register_like_installed_ones() -> None:
    from types import SimpleNamespace

    from outbox_core import hookimpl

    @hookimpl
    def outbox_register_kinds(register: Any) -> None:
        register(NoopAdapter)

    host = build_host(
        [("app", SimpleNamespace(outbox_register_kinds=outbox_register_kinds))],
        use_entry_points=False,
    )
    assert host.registry.kinds == ["TEST_NOOP"]


def test_every_hook_is_documented_with_a_typed_signature() -> None:
    specs = [
        obj for name, obj in vars(hookspecs).items() if name.startswith("outbox_") and callable(obj)
    ]
    assert len(specs) >= 4
    for spec in specs:
        assert (spec.__doc__ or "").strip(), f"{spec.__name__} has no docstring"
        signature = inspect.signature(spec)
        assert all(
            p.annotation is not inspect.Parameter.empty for p in signature.parameters.values()
        ), spec.__name__


def test_the_plugins_command_prints_json(site: Path) -> None:
    install_fake_distribution(site, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)
    completed = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "plugins"],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0, completed.stderr
    listed = json.loads(completed.stdout)
    by_dist = {p["distribution"]: p for p in listed["plugins"]}
    assert by_dist["outbox-core"]["migration_lines"] == ["core"]
    fake = by_dist["outbox-fake"]["kinds"][0]
    assert fake["kind"] == "FAKE_KIND"
    assert fake["variants"]["shape"] == "one"


def test_a_hook_that_names_context_gets_its_plugin_its_host_and_its_own_state() -> None:
    from types import SimpleNamespace

    from outbox_core import RegistrationContext, hookimpl

    seen: list[RegistrationContext] = []

    @hookimpl
    def outbox_add_hookspecs(context: RegistrationContext) -> None:
        seen.append(context)
        context.state["collected"] = ["from add_hookspecs"]

    @hookimpl
    def outbox_register_kinds(register: Any, context: RegistrationContext) -> None:
        seen.append(context)
        context.state["collected"].append("from register_kinds")
        register(NoopAdapter)

    plugin = SimpleNamespace(
        outbox_add_hookspecs=outbox_add_hookspecs, outbox_register_kinds=outbox_register_kinds
    )
    first = build_host([("app", plugin)], use_entry_points=False)
    second = build_host([("app", plugin)], use_entry_points=False)
    assert [context.plugin for context in seen] == ["app"] * 4
    assert seen[0].pluginmanager is first.pluginmanager
    assert seen[2].pluginmanager is second.pluginmanager
    assert first.plugin_state["app"] == {"collected": ["from add_hookspecs", "from register_kinds"]}
    assert second.plugin_state["app"] is not first.plugin_state["app"]  # one state per host


def test_an_allowlist_naming_no_installed_plugin_is_an_error_naming_the_nearest(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OUTBOX_PLUGINS=faek`` would start an executor serving none of the plugin's kinds."""
    from outbox_core import ConfigurationError

    install_fake_distribution(site, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)
    monkeypatch.setenv("OUTBOX_PLUGINS", "faek")
    with pytest.raises(ConfigurationError) as refused:
        load_plugins()
    message = str(refused.value)
    assert message.startswith(
        "OUTBOX_PLUGINS: no installed plugin is named 'faek' (did you mean 'fake'?); installed: "
    )
    assert "fake" in message.split("installed: ", 1)[1]


@pytest.mark.parametrize("command", [["plugins"], ["run"]], ids=" ".join)
def test_outbox_plugins_and_outbox_run_refuse_an_allowlist_typo_in_one_line(
    site: Path, command: list[str]
) -> None:
    install_fake_distribution(site, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)
    completed = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            "PYTHONPATH": str(site),
            "PATH": "/usr/bin:/bin",
            "OUTBOX_PLUGINS": "faek",
            "OUTBOX_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/never-reached",
        },
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.splitlines() == [completed.stderr.splitlines()[0]], completed.stderr
    assert completed.stderr.startswith(
        "outbox: error: configuration: OUTBOX_PLUGINS: no installed plugin is named 'faek' "
        "(did you mean 'fake'?)"
    )
    assert completed.stdout == ""
