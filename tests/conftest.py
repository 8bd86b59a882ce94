"""Cross-package suites: real PostgreSQL through the outbox_core pytest plugin."""
