"""outbox_issues's source keeps the house's shape (issue 33): its modules import one way, and one
over 450 lines says in its first lines why it is one piece (``outbox_core.testing.shape``)."""

from __future__ import annotations

import outbox_issues
from outbox_core.testing.shape import PackageShape


class TestShape(PackageShape):
    package = outbox_issues
    awaiting = {
        "circles": (
            "testing.provider's conformance_target imports serve_issues from "
            "testing/__init__ (house-servers rewrites conformance_target, issue 33)"
        ),
        "sizes": (
            "tracker.py and adapter.py are split by house-http, testing/server.py rebuilt "
            "on the core's loopback HTTP server by house-servers (issue 33)"
        ),
    }
