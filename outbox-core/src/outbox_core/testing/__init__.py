"""The harness that outbox's own packages, plugin authors and applications test with.

- :func:`drain` / :func:`adrain`: make every waiting action due and run the executor until no
  action is due (the specification's ``ActionTestSupport.drain``), on a test database only
  (:class:`NotATestDatabase` elsewhere, unless ``allow_any_database=True``).
- The pytest plugin (``outbox_core.testing.plugin``, loaded by the ``pytest11`` entry point):
  a session-wide PostgreSQL, a template database migrated once per session, and a fresh
  database per test (fixture ``outbox_db``) where throwaway kinds can be registered.
- :mod:`outbox_core.testing.conformance`: the adapter conformance suite, a pytest class
  (``AdapterConformance``) that a plugin subclasses with one fixture, its target (imported on
  its own: it needs pytest).
- :mod:`outbox_core.testing.loopback_http` and :mod:`outbox_core.testing.faults`: the base of
  the packages' loopback HTTP fakes (lifecycle, recording, drops, stalls, refused
  connections) and their fault switches.
- :mod:`outbox_core.testing.plugin_listed`: the first test of every plugin, a pytest class
  (``PluginListed``) that a package subclasses with its names (imported on its own).
"""

from __future__ import annotations

from .database import OutboxTestDatabase, find_server
from .draining import NotATestDatabase, adrain, drain

__all__ = ["NotATestDatabase", "OutboxTestDatabase", "adrain", "drain", "find_server"]
