"""The producer's side: enqueue inside the caller's own transaction, and the plain reads.

``Outbox`` binds a schema and a kind registry; the module-level functions in ``outbox_core``
use the one built from the environment and the installed plugins.

Longer than 400 lines on purpose: each public read and write is here three times over, as its
steps (the checks, the statements, the reading of rows) and its two thin shells, sync and
async (:mod:`outbox_core.steps`), beside the validation they share.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg.types.json import Jsonb

from . import tracing
from .action import Action
from .adapter import EnqueueCheck, has_own
from .enqueue_rows import (
    Prepared,
    PreparedBatch,
    batch_answers,
    batch_document,
    distinct_keys,
    prepare_batch,
    prepare_one,
    request_row,
)
from .errors import IdempotencyConflict, InvalidRequest, UndecodableAction
from .lane_locks import lanes_first_steps
from .plugins import PluginHost, load_plugins
from .registry import KindRegistry, RegisteredKind
from .requests import ActionRequest, Enqueued
from .results import StopReason
from .settings import OutboxSettings
from .sqlfiles import channel_name, core_queries, quote_schema
from .states import ActionState
from .steps import AsyncOnly, Call, Query, Steps, arun, atomic, run


class Outbox:
    """A schema and the kinds this build serves."""

    def __init__(
        self,
        *,
        schema: str = "outbox",
        registry: KindRegistry | None = None,
        host: PluginHost | None = None,
        settings: OutboxSettings | None = None,
    ) -> None:
        quote_schema(schema)
        self.schema = schema
        self.settings = settings if settings is not None else OutboxSettings(schema_name=schema)
        self._host = host
        self._registry = registry

    @classmethod
    def from_settings(cls, settings: OutboxSettings | None = None) -> Outbox:
        settings = settings if settings is not None else OutboxSettings()
        return cls(schema=settings.schema_name, settings=settings)

    @property
    def host(self) -> PluginHost:
        if self._host is None:
            self._host = load_plugins()
        return self._host

    @property
    def registry(self) -> KindRegistry:
        if self._registry is None:
            self._registry = self.host.registry
        return self._registry

    @cached_property
    def queries(self) -> dict[str, str]:
        return core_queries(self.schema)

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel idle executors of this schema wait on."""
        return channel_name(self.schema)

    # -- enqueue -------------------------------------------------------------------------------

    def prepare(self, request: ActionRequest, *, now: datetime | None = None) -> Prepared:
        """Validate a request against its kind; InvalidRequest/UnknownKind name the culprit."""
        return prepare_one(self.registry, request, now, self.settings.retention_days)

    def _prepare_batch(
        self, requests: Sequence[ActionRequest], now: datetime | None
    ) -> PreparedBatch:
        return prepare_batch(self.registry, requests, now, self.settings.retention_days)

    @staticmethod
    def _check_call(entry: RegisteredKind, check: EnqueueCheck) -> Call:
        adapter = entry.adapter
        return Call(
            adapter.check_enqueue if has_own(adapter, "check_enqueue") else None,
            adapter.acheck_enqueue,
            (check,),
            what=f"the enqueue check of {entry.kind} has only an async form "
            f"({adapter.__qualname__}.acheck_enqueue): enqueue it from async code with "
            "`await aenqueue(...)`; nothing was written",
        )

    def _checks(self, items: Iterable[Prepared]) -> Steps[None]:
        """Each request's kind's own enqueue check (:meth:`ActionAdapter.check_enqueue`), before
        anything is written; a kind without one is skipped."""
        for item in items:
            if item.entry.checks_enqueue:
                yield self._check_call(
                    item.entry, EnqueueCheck(item.request, item.payload, item.body, self.schema)
                )

    def check_steps(self, requests: Sequence[ActionRequest]) -> Steps[None]:
        """:meth:`check` as steps."""
        now = (yield from self._now_steps()) if self._needs_clock(requests) else None
        yield from self._checks(self._prepare_batch(requests, now).checked())

    def check(self, conn: Connection[Any], requests: Sequence[ActionRequest]) -> None:
        """Every check an enqueue of ``requests`` makes (the request, its payload against the
        kind's variants, the kind's own enqueue check), writing nothing: for an entry point that
        writes rows of its own before it enqueues, so that it refuses first."""
        run(conn, self.check_steps(requests))

    async def acheck(self, conn: AsyncConnection[Any], requests: Sequence[ActionRequest]) -> None:
        """The async twin of :meth:`check`."""
        await arun(conn, self.check_steps(requests))

    @staticmethod
    def _needs_clock(requests: Iterable[ActionRequest]) -> bool:
        return any(request.expires_at is not None for request in requests)

    @staticmethod
    def _found(
        requests: Iterable[ActionRequest], rows: Iterable[tuple[Any, ...]]
    ) -> dict[str, int]:
        """The action each key names (``find_by_keys``' rows); IdempotencyConflict when one
        names another effect than the request that holds its key."""
        found: dict[str, tuple[int, str, str]] = {
            key: (action_id, kind, lane_key) for key, action_id, kind, lane_key in rows
        }
        for request in requests:
            key = request.idempotency_key
            if key not in found:
                # Only possible when the conflicting insert is invisible to this transaction's
                # snapshot (REPEATABLE READ callers); PostgreSQL reports that as a serialization
                # failure first, so reaching here means the row vanished (an erasure).
                raise InvalidRequest(
                    "idempotency_key",
                    f"{key!r} conflicted with an action that is gone; retry",
                )
            action_id, kind, lane_key = found[key]
            if kind != request.kind or lane_key != request.lane_key:
                raise IdempotencyConflict(
                    "idempotency_key",
                    f"{key!r} already names action {action_id} ({kind} in lane "
                    f"{lane_key!r}); this request is {request.kind} in lane "
                    f"{request.lane_key!r}. Use a key that names this effect",
                )
        return {key: action_id for key, (action_id, _, _) in found.items()}

    # Each operation below is written once, as steps (see :mod:`outbox_core.steps`): its checks,
    # its statements and the reading of its rows. The sync method and its async twin (``a``
    # prefix) only run the steps; ``*_steps`` compose into a plugin's own operation.

    def enqueue_steps(self, request: ActionRequest) -> Steps[Enqueued]:
        """:meth:`enqueue` as steps (``yield from outbox.enqueue_steps(request)``)."""
        now = (yield from self._now_steps()) if self._needs_clock((request,)) else None
        prepared = prepare_one(self.registry, request, now, self.settings.retention_days)
        if prepared.entry.checks_enqueue:
            yield from self._checks((prepared,))
        # Beside the payload, never in it (None without an active span): tracing.py.
        row = request_row(prepared, tracing.current_context())
        rows = yield Query(self.queries["enqueue"], {"request": Jsonb(row)})
        if rows:
            return Enqueued(int(rows[0][0]), True)
        found = yield Query(self.queries["find_by_keys"], {"keys": [request.idempotency_key]})
        return Enqueued(self._found((request,), found)[request.idempotency_key], False)

    def enqueue(self, conn: Connection[Any], request: ActionRequest) -> Enqueued:
        """Enqueue in ``conn``'s current transaction (the caller commits)."""
        return run(conn, self.enqueue_steps(request))

    async def aenqueue(self, conn: AsyncConnection[Any], request: ActionRequest) -> Enqueued:
        """The async twin of :meth:`enqueue`."""
        return await arun(conn, self.enqueue_steps(request))

    def enqueue_many_steps(self, requests: Sequence[ActionRequest]) -> Steps[list[Enqueued]]:
        """:meth:`enqueue_many` as steps."""
        if not requests:
            return []
        now = (yield from self._now_steps()) if self._needs_clock(requests) else None
        batch = self._prepare_batch(requests, now)
        distinct = distinct_keys(batch)
        # Every check before the first write: one refused request refuses the whole batch.
        yield from self._checks(batch.checked())
        # A savepoint: a key that turns out to name another effect undoes the whole batch.
        return (yield from atomic(self._insert_many_steps(batch, distinct)))

    def _insert_many_steps(self, batch: PreparedBatch, distinct: int) -> Steps[list[Enqueued]]:
        # One span is current for the whole call: its context, beside each payload (tracing.py).
        trace_context = tracing.current_context()
        params = {
            # Jsonb: one call of the JSON dumps psycopg is configured with (the application's,
            # if it set one with set_json_dumps, as the single enqueue's request uses).
            "batch": Jsonb(batch_document(batch)),
            "trace_context": None if trace_context is None else Jsonb(trace_context),
        }
        rows = yield Query(self.queries["enqueue_many"], params)
        created: list[int] = rows[0][0] or []
        if len(created) == distinct:
            return batch_answers(batch.requests, created, None)
        # Some key was not new: which action each names (the new ones too, in this transaction).
        keys = list(dict.fromkeys(request.idempotency_key for request in batch.requests))
        found = yield Query(self.queries["find_by_keys"], {"keys": keys})
        return batch_answers(batch.requests, created, self._found(batch.requests, found))

    def enqueue_many(
        self, conn: Connection[Any], requests: Sequence[ActionRequest]
    ) -> list[Enqueued]:
        """Enqueue many requests in one statement; the answers are in request order."""
        return run(conn, self.enqueue_many_steps(requests))

    async def aenqueue_many(
        self, conn: AsyncConnection[Any], requests: Sequence[ActionRequest]
    ) -> list[Enqueued]:
        """The async twin of :meth:`enqueue_many`."""
        return await arun(conn, self.enqueue_many_steps(requests))

    def _now_steps(self) -> Steps[datetime]:
        rows = yield Query(self.queries["database_now"])
        now: datetime = rows[0][0]
        return now

    # -- proposals and cancellation ------------------------------------------------------------

    def admit_steps(self, action_id: int) -> Steps[bool]:
        """:meth:`admit` as steps."""
        if any(entry.checks_enqueue for entry in self.registry):
            # Only a build with a kind that checks pays for reading the proposal first.
            found = yield Query(self.queries["action_by_id"], {"id": action_id})
            if found:
                yield from self._admit_check_steps(Action.from_row(found[0]))
        rows = yield Query(self.queries["admit"], {"id": action_id})
        return bool(rows)

    def _admit_check_steps(self, proposal: Action) -> Steps[None]:
        """The enqueue check of a proposal's kind, again at its admission (who may receive an
        effect can change while it waits); an action that is no proposal is left to ``admit``."""
        if proposal.state is not ActionState.PROPOSED or proposal.kind not in self.registry:
            return
        entry = self.registry.get(proposal.kind)
        if not entry.checks_enqueue:
            return
        body = entry.variants.decode_or_raise(
            proposal.payload, proposal.idempotency_key, kind=proposal.kind
        )
        assert proposal.payload is not None and body is not None  # a proposal has a payload
        request = ActionRequest(
            kind=proposal.kind,
            lane_key=proposal.lane_key,
            idempotency_key=proposal.idempotency_key,
            payload=proposal.payload,
            workspace_id=proposal.workspace_id,
            subject_account_id=proposal.subject_account_id,
            max_attempts=proposal.max_attempts,
            expires_at=proposal.expires_at,
            not_before=proposal.due_at,
        )
        yield self._check_call(entry, EnqueueCheck(request, proposal.payload, body, self.schema))

    def admit(self, conn: Connection[Any], action_id: int) -> bool:
        """PROPOSED -> ADMITTED; False when the action is not a proposal (any more). The
        kind's enqueue check runs again first (:meth:`ActionAdapter.check_enqueue`): when it
        refuses, the proposal stays PROPOSED (cancel it, or admit it later)."""
        return run(conn, self.admit_steps(action_id))

    async def aadmit(self, conn: AsyncConnection[Any], action_id: int) -> bool:
        """The async twin of :meth:`admit`."""
        return await arun(conn, self.admit_steps(action_id))

    def cancel_steps(
        self,
        action_id: int,
        reason: str = StopReason.OPERATOR_CANCELLED,
        *,
        lock_wait_seconds: float = 30.0,
    ) -> Steps[Action | None]:
        """:meth:`acancel` as steps."""

        def cancel_action() -> Steps[tuple[Any, ...] | None]:
            yield Query(self.queries["lock_action_lane"], {"id": action_id})
            yield Query(self.queries["lock_action"], {"id": action_id})
            rows = yield Query(
                self.queries["cancel_unstarted"], {"id": action_id, "reason": reason}
            )
            if not rows:
                return None
            row: tuple[Any, ...] = rows[0]
            if self._has_ended_hook(row[1]):
                # Still inside the savepoint: a sync caller is refused with nothing changed.
                yield AsyncOnly(
                    f"cancel of action {action_id}: the adapter of {row[1]} moves its domain "
                    "rows in an async ended(), which the cancel runs; cancel it from async code "
                    "with `await outbox.acancel(conn, ...)`"
                )
            yield Query(self.queries["lower_lanes_wait"], {"lanes": [row[3]]})
            return row

        row = yield from lanes_first_steps(
            cancel_action,
            what=f"cancel of action {action_id}",
            wait_seconds=lock_wait_seconds,
        )
        if row is None:
            return None
        action = Action.from_row(row)
        if self._has_ended_hook(action.kind):
            adapter = self.registry.get(action.kind).adapter.build(self.settings)
            yield Call(None, adapter.ended, (action,), what=f"{action.kind}'s ended()")
        return action

    def _has_ended_hook(self, kind: str) -> bool:
        """Whether the kind's adapter has an ``ended`` of its own (the base one does nothing)."""
        if kind not in self.registry:
            return False
        return has_own(self.registry.get(kind).adapter, "ended")

    def cancel(
        self,
        conn: Connection[Any],
        action_id: int,
        reason: str = StopReason.OPERATOR_CANCELLED,
        *,
        lock_wait_seconds: float = 30.0,
    ) -> Action | None:
        """The sync twin of :meth:`acancel`, for kinds whose adapter has no ``ended`` of its
        own: for the others (``ended`` is async) it raises :class:`~outbox_core.steps.NeedsAsync`
        and changes nothing; cancel those with :meth:`acancel`."""
        return run(conn, self.cancel_steps(action_id, reason, lock_wait_seconds=lock_wait_seconds))

    async def acancel(
        self,
        conn: AsyncConnection[Any],
        action_id: int,
        reason: str = StopReason.OPERATOR_CANCELLED,
        *,
        lock_wait_seconds: float = 30.0,
    ) -> Action | None:
        """End an action that has not started (PROPOSED or ADMITTED) as CANCELLED, calling its
        kind's ``ended`` in ``conn``'s transaction. None when it has started or ended (an
        admitted action whose write started, waiting out a deferral, has started).

        The lane is taken before the action, and an action that another transaction holds is
        waited for without holding the lane (see :mod:`outbox_core.lane_locks`), for up to
        ``lock_wait_seconds``; then :class:`~outbox_core.lane_locks.LocksBusy` is raised."""
        return await arun(
            conn, self.cancel_steps(action_id, reason, lock_wait_seconds=lock_wait_seconds)
        )

    # -- reads ---------------------------------------------------------------------------------

    def get_steps(self, action_id: int) -> Steps[Action | None]:
        """:meth:`get` as steps."""
        rows = yield Query(self.queries["action_by_id"], {"id": action_id})
        return Action.from_row(rows[0]) if rows else None

    def get(self, conn: Connection[Any], action_id: int) -> Action | None:
        """One action by id, whatever its kind (not decoded); None when there is none."""
        return run(conn, self.get_steps(action_id))

    async def aget(self, conn: AsyncConnection[Any], action_id: int) -> Action | None:
        """The async twin of :meth:`get`."""
        return await arun(conn, self.get_steps(action_id))

    def lane_steps(
        self, lane_key: str, *, live_only: bool = True, decode: bool = True
    ) -> Steps[list[Action]]:
        """:meth:`lane` as steps."""
        rows = yield Query(
            self.queries["lane_actions"], {"lane_key": lane_key, "live_only": live_only}
        )
        return self._actions(rows, decode)

    def lane(
        self, conn: Connection[Any], lane_key: str, *, live_only: bool = True, decode: bool = True
    ) -> list[Action]:
        """Every action of one lane, unfiltered. With ``decode`` (the default) an action of a
        kind or variant this build cannot decode raises :class:`UndecodableAction`."""
        return run(conn, self.lane_steps(lane_key, live_only=live_only, decode=decode))

    async def alane(
        self,
        conn: AsyncConnection[Any],
        lane_key: str,
        *,
        live_only: bool = True,
        decode: bool = True,
    ) -> list[Action]:
        """The async twin of :meth:`lane`."""
        return await arun(conn, self.lane_steps(lane_key, live_only=live_only, decode=decode))

    def by_keys_steps(self, keys: Sequence[str], *, decode: bool = True) -> Steps[list[Action]]:
        """:meth:`by_keys` as steps."""
        rows = yield Query(self.queries["actions_by_keys"], {"keys": list(keys)})
        return self._actions(rows, decode)

    def by_keys(
        self, conn: Connection[Any], keys: Sequence[str], *, decode: bool = True
    ) -> list[Action]:
        """The actions holding these idempotency keys, unfiltered (see :meth:`lane`)."""
        return run(conn, self.by_keys_steps(keys, decode=decode))

    async def aby_keys(
        self, conn: AsyncConnection[Any], keys: Sequence[str], *, decode: bool = True
    ) -> list[Action]:
        """The async twin of :meth:`by_keys`."""
        return await arun(conn, self.by_keys_steps(keys, decode=decode))

    def _actions(self, rows: list[tuple[Any, ...]], decode: bool) -> list[Action]:
        actions = [Action.from_row(row) for row in rows]
        if decode:
            for action in actions:
                self.decode(action)
        return actions

    def decode(self, action: Action) -> Any:
        """The payload of a live action as its variant's model, None for an ended one (which
        has no payload); UndecodableAction when this build lacks the kind or the variant (for
        key-suffix variants also of an ended action: its key still names the variant)."""
        if action.kind not in self.registry:
            raise UndecodableAction(
                f"action {action.id} is a {action.kind}, a kind this build does not have "
                f"(installed: {', '.join(self.registry.kinds) or 'none'}); a newer build wrote it"
            )
        entry = self.registry.get(action.kind)
        return entry.variants.decode_or_raise(
            action.payload, action.idempotency_key, kind=action.kind
        )


_default: Outbox | None = None
_default_lock = threading.Lock()


def default_outbox() -> Outbox:
    """The Outbox of this process: settings from the environment, kinds from the plugins."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Outbox.from_settings()
        return _default


def enqueue(conn: Connection[Any], request: ActionRequest) -> Enqueued:
    """Enqueue ``request`` in ``conn``'s transaction; it exists exactly when that commits."""
    return default_outbox().enqueue(conn, request)


async def aenqueue(conn: AsyncConnection[Any], request: ActionRequest) -> Enqueued:
    """The async twin of :func:`enqueue`."""
    return await default_outbox().aenqueue(conn, request)


def enqueue_many(conn: Connection[Any], requests: Sequence[ActionRequest]) -> list[Enqueued]:
    """Enqueue many requests in one round trip, in ``conn``'s transaction."""
    return default_outbox().enqueue_many(conn, requests)


async def aenqueue_many(
    conn: AsyncConnection[Any], requests: Sequence[ActionRequest]
) -> list[Enqueued]:
    """The async twin of :func:`enqueue_many`."""
    return await default_outbox().aenqueue_many(conn, requests)
