"""The first test of every plugin, in one place: ``outbox plugins`` lists it with its kinds and
migration line, importing its plugin module pulls in no provider SDK, and its kinds are
registered in the database. Imported on its own: it needs pytest.

A package's ``tests/test_plugin_listed.py`` subclasses :class:`PluginListed` with only its own
names, and its conftest runs that file first::

    from outbox_core.testing.plugin_listed import PluginListed

    class TestOutboxDraftIsListed(PluginListed):
        distribution = "outbox-draft"
        name = "draft"
        kinds = {"DRAFT_REPORT": {"adapter": "outbox_draft.adapter.DraftReportAdapter",
                                  "at_most_once": False, "instance_level": False,
                                  "variants": {"shape": "one"}}}
        not_imported = ("httpx",)

    # conftest.py
    from outbox_core.testing.plugin_listed import plugin_listed_first
    pytest_collection_modifyitems = plugin_listed_first
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from ..plugins import build_host
from .database import OutboxTestDatabase

__all__ = ["PROBE", "PluginListed", "plugin_listed_first"]

PROBE = """
import sys
sys.argv = ["outbox", "plugins"]
import {module}
import outbox_core.cli as cli
try:
    cli.main()
except SystemExit as exit:
    if exit.code not in (0, None):
        raise
imported = sorted(m for m in sys.modules if m.split(".")[0] in {not_imported!r})
print(repr(imported), file=sys.stderr)
"""
"""Run in a fresh interpreter: imports the plugin module, runs ``outbox plugins`` (its JSON on
stdout), then names on stderr the modules of ``not_imported`` that either pulled in."""


def plugin_listed_first(items: list[pytest.Item]) -> None:
    """The plugin's first test runs first (a conftest's ``pytest_collection_modifyitems``)."""
    items.sort(key=lambda item: item.path.name != "test_plugin_listed.py")


def _matches(listed: Any, expected: Any) -> bool:
    """``expected``'s keys have the same values in ``listed`` (dictionaries compared so, deep)."""
    if isinstance(expected, dict):
        return isinstance(listed, dict) and all(
            key in listed and _matches(listed[key], value) for key, value in expected.items()
        )
    return bool(listed == expected)


class PluginListed:
    """The tests of a plugin's listing; a subclass gives the package's names."""

    distribution: ClassVar[str]
    """The distribution, e.g. ``outbox-draft``."""
    name: ClassVar[str]
    """The plugin's name, its module ``outbox_<name>.plugin`` and its migration line."""
    kinds: ClassVar[dict[str, dict[str, Any]]]
    """Each kind and what its listing says (a subset of ``outbox plugins``' entry, compared
    key by key; ``variants`` too)."""
    not_imported: ClassVar[tuple[str, ...]] = ()
    """Top-level modules (a provider's SDK) that neither the plugin module nor the
    ``outbox plugins`` command may import."""

    @property
    def module(self) -> str:
        return f"{self.distribution.replace('-', '_')}.plugin"

    def _entry(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        found = [entry for entry in entries if entry["distribution"] == self.distribution]
        assert found, f"{self.distribution} is not listed: {[e['distribution'] for e in entries]}"
        return found[0]

    def _check(self, entry: dict[str, Any]) -> None:
        assert entry["name"] == self.name
        assert entry["module"] == self.module
        assert entry["migration_lines"] == [self.name]
        listed = {kind["kind"]: kind for kind in entry["kinds"]}
        assert sorted(listed) == sorted(self.kinds)
        for kind, expected in self.kinds.items():
            assert _matches(listed[kind], expected), (kind, listed[kind], expected)

    def test_the_plugin_host_lists_the_plugin_its_kinds_and_its_migration_line(self) -> None:
        self._check(self._entry(build_host().describe()))

    def test_the_outbox_plugins_command_lists_it_without_importing_a_provider_sdk(self) -> None:
        probe = PROBE.format(module=self.module, not_imported=tuple(self.not_imported))
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        listed = json.loads(done.stdout)
        entries = listed if isinstance(listed, list) else listed.get("plugins", [])
        self._check(self._entry(entries))
        assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr

    def test_the_kinds_are_registered_in_the_database_on_the_plugins_line(
        self, outbox_db: OutboxTestDatabase
    ) -> None:
        rows = outbox_db.rows(
            "SELECT kind, at_most_once, instance_level, line FROM {schema}.action_kind "
            "WHERE line = %s ORDER BY kind",
            (self.name,),
        )
        registered = {row[0]: (row[1], row[2], row[3]) for row in rows}
        assert sorted(registered) == sorted(self.kinds)
        for kind, expected in self.kinds.items():
            at_most_once, instance_level, line = registered[kind]
            assert line == self.name
            if "at_most_once" in expected:
                assert at_most_once is expected["at_most_once"], kind
            if "instance_level" in expected:
                assert instance_level is expected["instance_level"], kind
