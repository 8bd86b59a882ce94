"""The loopback tracker as the core's adapter conformance suite steers it, for the four kinds.

The suite (``outbox_core.testing.conformance``) reads a provider through four methods;
:class:`IssuesProvider` gives them over a :class:`GitHubTestServer` for one kind, and makes the
suite's requests (:meth:`IssuesProvider.request`) with the domain rows the kind needs stored
first: a report and its filing, and for ``PUBLISH_REPORT``, ``TRANSFER_ISSUE`` and
``CLEANUP_ISSUE`` an issue already filed on the server (for ``CLEANUP_ISSUE`` with the reporter
then erased, as the erasure leaves it)::

    class TestFileIssueConforms(AdapterConformance):
        @pytest.fixture
        def conformance_target(self, outbox_db, tracker_server):
            return conformance_target(outbox_db, tracker_server, "FILE_ISSUE")

The payloads hold identifiers only, so the suite's canary is the report's id (in the payload,
the lane and the issue's marker) and also stands in the report's title and text: no log record
may repeat it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from psycopg import Connection

from outbox_core import ActionRequest

from .. import markers
from ..adapter import CLEANUP_ISSUE, FILE_ISSUE, KINDS, PUBLISH_REPORT, TRANSFER_ISSUE
from ..domain import FilingState, file_key, lane, queries, sources
from ..person_data import still_published
from .server import PUBLIC, GitHubTestServer

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase
    from outbox_core.testing.conformance import Fault

WORKSPACE = "ws-conformance"
REPORTER = "acct-conformance"


def store_report(
    conn: Connection[Any], sql: Mapping[str, str], report: str, title: str, text: str
) -> bool:
    """Store a conformance report of the workspace and reporter above and its filing (the
    report's id is ``report``); False when a report of that id was stored already. The
    conformance providers of outbox-issues and outbox-draft make their reports with it."""
    params = {
        "report": report,
        "workspace": WORKSPACE,
        "reporter": REPORTER,
        "title": title,
        "text": text,
    }
    if conn.execute(sql["insert_report"], params).fetchone() is None:
        return False
    conn.execute(sql["insert_filing"], params)
    return True


WRITES = {
    FILE_ISSUE: "create_issue",
    PUBLISH_REPORT: "update_issue",
    CLEANUP_ISSUE: "update_issue",
    TRANSFER_ISSUE: "graphql:transferIssue",
}
"""The operation each kind writes with: where a fault is put."""


class IssuesProvider:
    """``requests()``, ``writes(request)``, ``fault(fault)``, ``clear_faults()`` over a server,
    for one kind, and the suite's request factory (:meth:`request`).

    - ``refuse``: the tracker is unreachable (:meth:`GitHubTestServer.refuse_connections`):
      every connection is refused before a request is sent, so it provably holds nothing
      (GitHub's only such refusal that is not a rate limit: a 5xx or a dropped answer may have
      written, and a rate limit defers without spending an attempt). It lasts through the
      executor's run that follows and ends when the test next looks at or steers the provider
      (a call of it made outside an event loop; the suite's probe calls it from inside);
    - ``drop``: the write is recorded, then the connection closed before the answer;
    - ``stall``: the write is recorded, then the answer never comes (the adapter's request
      timeout ends the call);
    - ``unreadable``: a switch until :meth:`clear_faults`: every read answers 503
      (:meth:`GitHubTestServer.make_unreadable`), writes are answered.

    ``writes(request)`` counts the effects held for the action, by marker: ``FILE_ISSUE`` the
    issues created with its filing's marker, ``PUBLISH_REPORT`` and ``CLEANUP_ISSUE`` the edits
    of the issue that carry the action's own marker, ``TRANSFER_ISSUE`` the transfers of the
    issue filed for its report."""

    def __init__(self, server: GitHubTestServer, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not an outbox-issues kind; use one of {KINDS}")
        self.server = server
        self.kind = kind
        self.filed_at: dict[str, str] = {}
        """Where the issue of each report was filed (``owner/name#number``)."""

    # -- the suite's LoopbackProvider ----------------------------------------------------------

    def requests(self) -> int:
        self._looked()
        with self.server.lock:
            return len(self.server.requests)

    def writes(self, request: ActionRequest) -> int:
        self._looked()
        payload = request.payload
        report = str(
            payload["report"] if isinstance(payload, Mapping) else payload.model_dump()["report"]
        )
        op = self.write_op()
        with self.server.lock:
            recorded = [write for write in self.server.writes if write.op == op]
        if self.kind == FILE_ISSUE:
            marker = markers.inert_key(file_key(report, 1))
            return sum(1 for write in recorded if marker in write.markers)
        if self.kind == TRANSFER_ISSUE:
            return sum(1 for write in recorded if write.target == self.filed_at.get(report))
        own = markers.inert_key(request.idempotency_key)
        return sum(1 for write in recorded if own in write.markers)

    def write_op(self) -> str:
        """The server operation this kind writes with: where a fault is put."""
        return WRITES[self.kind]

    def fault(self, fault: Fault) -> None:
        self._looked()
        op = self.write_op()
        match fault:
            case "refuse":
                self.server.refuse_connections()
            case "drop":
                self.server.drop(op, after_recording=True)
            case "stall":
                self.server.stall(op, after_recording=True)
            case "unreadable":
                self.server.make_unreadable()

    def clear_faults(self) -> None:
        self.server.clear_faults()

    def _looked(self) -> None:
        """A call from the test (outside the executor's event loop) ends a refusal."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.server.accept_connections()

    # -- the suite's request factory -----------------------------------------------------------

    def request(self, db: OutboxTestDatabase, key: str, canary: str) -> ActionRequest:
        """A valid request of the kind with idempotency key ``key``, for a report of its own
        whose id holds ``canary``; the report, its filing and (but for ``FILE_ISSUE``) its
        filed issue are stored first, committed."""
        report = f"{canary}.{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        title = f"Conformance report {canary}"
        text = f"The export does nothing ({canary})."
        sql = queries(db.schema)
        with db.connect() as conn:
            if store_report(conn, sql, report, title, text):
                url = (
                    self._file(conn, sql, report, title, text) if self.kind != FILE_ISSUE else None
                )
                if self.kind == CLEANUP_ISSUE:
                    # As the erasure of the reporter leaves it: the filing without person data.
                    published = still_published(report, PUBLIC, url)
                    conn.execute(
                        sql["erase_filing_text"], {"report": report, "published": published}
                    )
                    conn.execute(sql["erase_report"], {"report": report})
        payload: dict[str, object] = {"report": report}
        if self.kind in (FILE_ISSUE, PUBLISH_REPORT):
            payload["generation"] = 1
        return ActionRequest(
            kind=self.kind,
            lane_key=lane(report),
            idempotency_key=key,
            payload=payload,
            workspace_id=WORKSPACE,
        )

    def _file(
        self, conn: Connection[Any], sql: dict[str, str], report: str, title: str, text: str
    ) -> str:
        """The issue on the server, as ``FILE_ISSUE`` files it, and the filing ``FILED``; its
        URL."""
        body = f"{markers.reporter_section(text)}\n\n{markers.action_marker(file_key(report, 1))}\n"
        server = self.server
        with server.lock:
            issue = server._new_issue(PUBLIC, title, body, ["feedback"], server.login)
        url = f"{server.base_url}/{PUBLIC}/issues/{issue.number}"
        self.filed_at[report] = f"{PUBLIC}#{issue.number}"
        conn.execute(
            sql["start_filing"],
            {"report": report, "repository": PUBLIC, "from": sources(FilingState.FILING)},
        )
        conn.execute(
            sql["filed"],
            {
                "report": report,
                "number": issue.number,
                "url": url,
                "generation": 1,
                "from": sources(FilingState.FILED),
            },
        )
        return url
