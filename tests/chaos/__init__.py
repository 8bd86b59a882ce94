"""The chaos suite (issue 22): executors killed, PostgreSQL restarted, a provider that fails, and
a checker of what must hold whatever happened. See docs/reliability.md."""
