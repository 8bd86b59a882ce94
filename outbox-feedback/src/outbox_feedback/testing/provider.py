"""The loopback tracker as the core's adapter conformance suite steers it, for the three
feedback kinds::

    class TestDeliverFeedbackConforms(AdapterConformance):
        @pytest.fixture
        def conformance_target(self, outbox_db, tracker_server):
            return conformance_target(outbox_db, tracker_server, "DELIVER_FEEDBACK")

Each suite request gets a feedback of its own (its id holds the suite's canary; payloads hold
identifiers only) on a pull request of its own, with a summary only, so that a send writes one
copy: ``DELIVER_FEEDBACK`` creates the summary comment; ``EDIT_FEEDBACK`` and
``RETRACT_FEEDBACK`` find it on the server already (seeded, its row ``present``) and change or
delete it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from psycopg import Connection

from outbox_core import ActionRequest
from outbox_issues import markers
from outbox_issues.testing import IssuesProvider
from outbox_issues.testing.server import PUBLIC, GitHubTestServer

from ..adapter import DELIVER_FEEDBACK, EDIT_FEEDBACK, KINDS, RETRACT_FEEDBACK
from ..copies import SUMMARY, copy_marker, summary_copy
from ..domain import VARIANT, lane, queries

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase

WORKSPACE = "ws-conformance"
AUTHOR = "acct-conformance"
WRITES = {
    DELIVER_FEEDBACK: "create_comment",
    EDIT_FEEDBACK: "update_comment",
    RETRACT_FEEDBACK: "delete_comment",
}
"""The operation each kind writes the summary copy with: where a fault is put."""


class FeedbackProvider(IssuesProvider):
    """outbox-issues' provider over the same server (``requests``, ``clear_faults``, the
    refusal that ends when the test looks again), for a feedback kind: ``writes(request)``
    counts the summary comments holding the feedback's copy marker (deliver), the edits that
    carry the action's marker (edit), the deletes of the seeded copy (retract)."""

    def __init__(self, server: GitHubTestServer, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not an outbox-feedback kind; use one of {KINDS}")
        self.server = server
        self.kind = kind
        self.pulls: dict[str, int] = {}
        self.seeded: dict[str, int] = {}
        """The seeded summary comment of each feedback (edit, retract)."""

    def writes(self, request: ActionRequest) -> int:
        self._looked()
        feedback_id = str(dict(request.payload)["feedback"])
        pull = self.pulls[feedback_id]
        if self.kind == DELIVER_FEEDBACK:
            marker = copy_marker(feedback_id, SUMMARY)
            return sum(1 for c in self.server.comments_on(PUBLIC, pull) if marker in c.body)
        op = self.write_op()
        with self.server.lock:
            recorded = [write for write in self.server.writes if write.op == op]
        if self.kind == RETRACT_FEEDBACK:
            target = f"comment {self.seeded[feedback_id]}"
            return sum(1 for write in recorded if write.target == target)
        own = markers.inert_key(request.idempotency_key)
        return sum(1 for write in recorded if own in write.markers)

    def write_op(self) -> str:
        return WRITES[self.kind]

    def request(self, db: OutboxTestDatabase, key: str, canary: str) -> ActionRequest:
        """A valid request of the kind whose key begins with ``key`` (the variant appended),
        for a feedback of its own whose id holds ``canary``, stored first (committed)."""
        feedback_id = f"{canary}.{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        sql = queries(db.schema)
        if feedback_id not in self.pulls:
            self.pulls[feedback_id] = self.server.add_pull_request(PUBLIC, f"Change {canary}")
        pull = self.pulls[feedback_id]
        with db.connect() as conn:
            inserted = conn.execute(
                sql["insert_feedback"],
                {
                    "feedback": feedback_id,
                    "workspace": WORKSPACE,
                    "author": AUTHOR,
                    "repository": PUBLIC,
                    "pull": pull,
                    "summary": f"Looks good, one nit ({canary}).",
                },
            ).fetchone()
            if inserted is not None and self.kind != DELIVER_FEEDBACK:
                self._seed(db, conn, feedback_id, pull)
        return ActionRequest(
            kind=self.kind,
            lane_key=lane(feedback_id),
            idempotency_key=f"{key}:{VARIANT}",
            payload={"feedback": feedback_id},
            workspace_id=WORKSPACE,
            subject_account_id=AUTHOR,
        )

    def _seed(
        self, db: OutboxTestDatabase, conn: Connection[Any], feedback_id: str, pull: int
    ) -> None:
        """The summary copy as an earlier send left it: on the server, its row present, its
        content an earlier one (so an edit has something to change)."""
        earlier = summary_copy(feedback_id, "An earlier summary.")
        server = self.server
        comment_id = server.add_comment(PUBLIC, pull, earlier.body("seed"))
        self.seeded[feedback_id] = comment_id
        sql = queries(db.schema)
        params = {"feedback": feedback_id, "item": SUMMARY}
        execute = conn.execute
        execute(sql["ensure_copy"], {**params, "surface": "comment", "marker": earlier.marker})
        execute(
            sql["copy_present"],
            {
                **params,
                "provider_id": comment_id,
                "url": f"{server.base_url}/{PUBLIC}/pull/{pull}#issuecomment-{comment_id}",
                "digest": earlier.digest,
                "position": None,
            },
        )
        execute(
            "UPDATE "
            + f'"{db.schema}"'
            + ".feedback SET delivered_revision = 1 WHERE feedback_id = %s",
            (feedback_id,),
        )
