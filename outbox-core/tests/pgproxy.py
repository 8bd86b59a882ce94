"""The reply-losing proxy moved to :mod:`outbox_core.testing.pgproxy` (the failover tests of
tests/chaos use it too); this name stays for the core's tests."""

from outbox_core.testing.pgproxy import ReplyLosingProxy

__all__ = ["ReplyLosingProxy"]
