"""Every installed kind, and the core's test kinds, in one test database, each pointed at its
package's loopback provider, with requests whose payloads are derived from the kinds'
registered variants (:mod:`.payloads`) and faults that the providers can be told to give."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from outbox_core import (
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Done,
    Failed,
    Retry,
)
from outbox_core.testing import OutboxTestDatabase
from outbox_email.testing import SmtpTestServer, serve_email
from outbox_issues.adapter import CLEANUP_ISSUE, FILE_ISSUE, PUBLISH_REPORT, TRANSFER_ISSUE
from outbox_issues.domain import cleanup_key, file_key, publish_key, transfer_key
from outbox_issues.domain import lane as report_lane
from outbox_issues.testing import GitHubTestServer, IssuesProvider, serve_issues
from outbox_issues.testing.provider import WRITES
from outbox_slack.adapter import lane_key as slack_lane
from outbox_slack.domain import queries as slack_queries
from outbox_slack.testing import SlackTestServer, serve_slack
from outbox_slack.testing.provider import CHANNEL

from .payloads import Variant, variants_of

CANARY = "cAnArY-5d1e"
"""In every free string of every payload. Looked for case-insensitively."""
WORKSPACE = "ws-security"
PHASES = ("ok", "4xx", "5xx", "drop")
"""A run goes through each: the providers well, refusing with a 4xx (SMTP 451), failing with a
5xx (SMTP 550), and dropping the connection after recording the write."""

CORE_KINDS_FILE = Path(__file__).resolve().parents[2] / "outbox-core" / "tests" / "kinds.py"


def core_test_kinds() -> ModuleType:
    """The core's throwaway test kinds (``outbox-core/tests/kinds.py``), imported by path: the
    core's tests are a package named ``tests`` too."""
    name = "outbox_core_test_kinds"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, CORE_KINDS_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


Stager = Callable[["World", str, Variant, str, "str | None"], ActionRequest]


@dataclass
class World:
    db: OutboxTestDatabase
    smtp: SmtpTestServer
    slack: SlackTestServer
    tracker: GitHubTestServer
    kinds: ModuleType = field(default_factory=core_test_kinds)
    phase: str = "ok"

    def __post_init__(self) -> None:
        for adapter in (
            self.kinds.NoopAdapter,
            self.kinds.FencedAdapter,
            self.kinds.ScriptedAdapter,
            self.kinds.AtMostOnceAdapter,
            self.kinds.WorkspaceAdapter,
            self.kinds.SuffixAdapter,
        ):
            self.db.register_kind(adapter)
        self.kinds.ScriptedAdapter.script = self._script
        serve_email(self.db, self.smtp, connect_timeout_seconds=2.0, command_timeout_seconds=2.0)
        serve_slack(self.db, self.slack, readback_window_seconds=0)
        serve_issues(self.db, self.tracker, listing_lag_seconds=0.0)
        self.issues = {kind: IssuesProvider(self.tracker, kind) for kind in WRITES}

    # -- the kinds and their requests ----------------------------------------------------------

    def variants(self) -> list[tuple[str, Variant]]:
        """(kind, variant) for every variant of every kind registered in the test database."""
        return [
            (entry.kind, variant)
            for entry in self.db.registry
            for variant in variants_of(entry.variants, CANARY)
        ]

    def request(
        self, kind: str, variant: Variant, key: str, subject: str | None = None
    ) -> ActionRequest:
        """A valid request of ``variant`` whose domain rows are stored (committed) first."""
        distribution = self.db.registry.get(kind).distribution
        stager = STAGERS.get(distribution, generic)
        return stager(self, kind, variant, key, subject)

    def enqueue(self, requests: list[ActionRequest]) -> list[int]:
        """Enqueue ``requests`` in one transaction; their ids."""
        with self.db.connect() as conn:
            ids = [self.db.outbox.enqueue(conn, request).id for request in requests]
            conn.commit()
        return ids

    # -- faults --------------------------------------------------------------------------------

    def fault(self, phase: str) -> None:
        """Every provider fails every write so until :meth:`clear`."""
        self.clear()
        self.phase = phase
        many = 1000
        match phase:
            case "4xx":
                self.smtp.reply("mail", 451, times=None)
                self.slack.fail("chat.postMessage", "invalid_arguments", status=400, times=None)
                for op in set(WRITES.values()):
                    self.tracker.fail(op, 404, "Not Found", times=many)
            case "5xx":
                self.smtp.reply("mail", 550, times=None)
                self.slack.server_error("chat.postMessage", status=503, times=None)
                for op in set(WRITES.values()):
                    self.tracker.fail(op, 502, times=many)
            case "drop":
                self.smtp.drop("content", times=None)
                self.slack.drop_after_recording("chat.postMessage", times=many)
                for op in set(WRITES.values()):
                    self.tracker.drop(op, after_recording=True, times=many)

    def clear(self) -> None:
        self.phase = "ok"
        self.smtp.clear_faults()
        self.slack.clear_faults()
        self.tracker.clear_faults()

    async def _script(self, attempt: ActionAttempt) -> AdapterResult:
        """The core's scripted kinds behave as a provider in the current phase would."""
        match self.phase:
            case "4xx":
                return Failed()
            case "5xx":
                return Retry()
        if not await attempt.fence().begin_write():
            return Failed()
        if self.phase == "drop":
            raise ConnectionResetError("the provider hung up after the write")
        return Done(f"ref-{attempt.id}")


def generic(
    world: World, kind: str, variant: Variant, key: str, subject: str | None
) -> ActionRequest:
    """The payload as derived, in a lane of the kind's own: for kinds whose adapter reads
    nothing of its own from the database."""
    return ActionRequest(
        kind=kind,
        lane_key=f"security:{kind.lower()}",
        idempotency_key=f"{key}:{variant.key_suffix}" if variant.key_suffix else key,
        payload=variant.payload,
        workspace_id=WORKSPACE,
        subject_account_id=subject,
    )


def slack(
    world: World, kind: str, variant: Variant, key: str, subject: str | None
) -> ActionRequest:
    """The turn and entries that the derived payload names, stored as ``post_turn`` stores
    them (the adapter reads the entries' text from the database)."""
    payload = variant.payload
    turn_id = f"{payload['turn_id']}.{key}"
    entries = [f"{entry}.{key}" for entry in payload["entry_ids"]]
    sql = slack_queries(world.db.schema)
    with world.db.connect() as conn:
        conn.execute(
            sql["insert_turn"],
            {
                "turn_id": turn_id,
                "workspace_id": WORKSPACE,
                "channel": CHANNEL,
                "thread_ts": None,
                "subject": subject,
                "key": key,
            },
        )
        conn.execute(
            sql["insert_entries"],
            {
                "turn_id": turn_id,
                "ids": entries,
                "kinds": ["question"] * len(entries),
                "positions": list(range(len(entries))),
                "channels": [CHANNEL] * len(entries),
                "texts": [f"entry text {CANARY}"] * len(entries),
            },
        )
    return ActionRequest(
        kind=kind,
        lane_key=slack_lane(CHANNEL, None),
        idempotency_key=key,
        payload={**payload, "turn_id": turn_id, "entry_ids": entries},
        workspace_id=WORKSPACE,
        subject_account_id=subject,
    )


def issues(
    world: World, kind: str, variant: Variant, key: str, subject: str | None
) -> ActionRequest:
    """The report the derived payload names, its filing and (for the kinds that change a filed
    issue) its issue on the tracker, as the package's conformance provider stores them; the
    report's reporter is ``subject`` when given."""
    provider = world.issues[kind]
    request = provider.request(world.db, key, CANARY)
    report = request.payload["report"]  # type: ignore[index]
    if subject is not None:
        world.db.execute(
            "UPDATE {schema}.issue_report SET reporter_account_id = %s WHERE report_id = %s",
            (subject, report),
        )
    assert request.lane_key == report_lane(report)
    # The kind's own key for the report: its ended() reads the report from the key.
    return dataclasses.replace(request, idempotency_key=ISSUE_KEYS[kind](report))


ISSUE_KEYS: dict[str, Callable[[str], str]] = {
    FILE_ISSUE: lambda report: file_key(report, 1),
    PUBLISH_REPORT: lambda report: publish_key(report, 1),
    TRANSFER_ISSUE: transfer_key,
    CLEANUP_ISSUE: cleanup_key,
}


STAGERS: dict[str, Stager] = {"outbox-slack": slack, "outbox-issues": issues}
"""How a package's requests get the domain rows their payloads name; other kinds: generic."""


def held(request: ActionRequest) -> Any:
    payload = request.payload
    return payload if isinstance(payload, dict) else payload.model_dump(mode="json")  # type: ignore[union-attr]
