"""The producer's side: enqueue inside the caller's own transaction, and the plain reads.

``Outbox`` binds a schema and a kind registry; the module-level functions in ``outbox_core``
use the one built from the environment and the installed plugins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg.types.json import Jsonb

from .action import Action
from .errors import IdempotencyConflict, InvalidRequest, UndecodableAction
from .lane_locks import _savepoint as _asavepoint
from .lane_locks import lanes_first
from .plugins import PluginHost, load_plugins
from .registry import KindRegistry, RegisteredKind
from .requests import ActionRequest, Enqueued
from .results import StopReason
from .settings import OutboxSettings
from .sqlfiles import core_queries, quote_schema
from .states import ActionState


@contextmanager
def _savepoint(conn: Connection[Any]) -> Iterator[None]:
    """The sync twin of :func:`outbox_core.lane_locks._savepoint`: not ``conn.transaction()``,
    which on an idle connection outside autocommit commits when it ends."""
    if conn.autocommit:
        with conn.transaction():
            yield
        return
    conn.execute("SAVEPOINT outbox_batch")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK TO SAVEPOINT outbox_batch")
        conn.execute("RELEASE SAVEPOINT outbox_batch")
        raise
    conn.execute("RELEASE SAVEPOINT outbox_batch")


@dataclass(frozen=True, slots=True)
class _Prepared:
    request: ActionRequest
    entry: RegisteredKind
    params: dict[str, Any]


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
        return f"outbox_{self.schema}"

    # -- enqueue -------------------------------------------------------------------------------

    def prepare(self, request: ActionRequest, *, now: datetime | None = None) -> _Prepared:
        """Validate a request against its kind; InvalidRequest/UnknownKind name the culprit."""
        entry = self.registry.get(request.kind)
        adapter = entry.adapter
        for name in ("lane_key", "idempotency_key"):
            value = getattr(request, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidRequest(name, "must be a non-empty string")
        max_attempts = (
            request.max_attempts
            if request.max_attempts is not None
            else adapter.default_max_attempts
        )
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidRequest(
                "max_attempts", f"must be an integer of at least 1, got {max_attempts!r}"
            )
        if request.workspace_id is None and not adapter.instance_level:
            raise InvalidRequest(
                "workspace_id",
                f"{request.kind} is not an instance-level kind; name the workspace of the effect",
            )
        for name in ("expires_at", "not_before"):
            value = getattr(request, name)
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise InvalidRequest(name, "must be a timezone-aware datetime")
        if request.expires_at is not None and now is not None and request.expires_at <= now:
            raise InvalidRequest(
                "expires_at",
                f"{request.expires_at.isoformat()} has already passed (database time "
                f"{now.isoformat()}); an expired action would never run",
            )
        if request.expires_at is not None and now is not None and adapter.retained:
            # An ended action keeps its key for the retention, and no longer: a notice that
            # may still arrive after that would find no key and enqueue its effect again.
            retention = timedelta(days=self.settings.retention_days)
            if request.expires_at > now + retention:
                raise InvalidRequest(
                    "expires_at",
                    f"{request.expires_at.isoformat()} is further out than the retention of "
                    f"ended actions ({self.settings.retention_days:g} days from database time "
                    f"{now.isoformat()}, OUTBOX_RETENTION_DAYS): a late redelivery after the "
                    "key was deleted would enqueue the effect again. Expire sooner, or raise "
                    "the retention for every replica",
                )
        payload = entry.variants.encode(request.payload)
        entry.variants.decode(payload, request.idempotency_key, kind=request.kind)
        params = {
            "kind": request.kind,
            "at_most_once": adapter.at_most_once,
            "instance_level": adapter.instance_level,
            "workspace_id": request.workspace_id,
            "lane_key": request.lane_key,
            "idempotency_key": request.idempotency_key,
            "payload": payload,
            "subject_account_id": request.subject_account_id,
            "state": str(ActionState.PROPOSED if request.proposed else ActionState.ADMITTED),
            "max_attempts": max_attempts,
            "due_at": request.not_before,
            "expires_at": request.expires_at,
        }
        return _Prepared(request, entry, params)

    def _single_params(self, prepared: _Prepared) -> dict[str, Any]:
        params = dict(prepared.params)
        params["payload"] = Jsonb(params["payload"])
        params["channel"] = self.channel
        return params

    def _many_params(self, prepared: Sequence[_Prepared]) -> dict[str, Any]:
        columns: dict[str, list[Any]] = {name: [] for name in prepared[0].params}
        for item in prepared:
            for name, value in item.params.items():
                columns[name].append(Jsonb(value) if name == "payload" else value)
        return {**columns, "channel": self.channel}

    @staticmethod
    def _needs_clock(requests: Iterable[ActionRequest]) -> bool:
        return any(request.expires_at is not None for request in requests)

    def _check_existing(
        self, prepared: Sequence[_Prepared], rows: Iterable[tuple[Any, ...]]
    ) -> dict[str, int]:
        found: dict[str, int] = {}
        for key, action_id, kind, lane_key in rows:
            found[key] = action_id
            for item in prepared:
                request = item.request
                if request.idempotency_key != key:
                    continue
                if kind != request.kind or lane_key != request.lane_key:
                    raise IdempotencyConflict(
                        "idempotency_key",
                        f"{key!r} already names action {action_id} ({kind} in lane "
                        f"{lane_key!r}); this request is {request.kind} in lane "
                        f"{request.lane_key!r}. Use a key that names this effect",
                    )
        return found

    def enqueue(self, conn: Connection[Any], request: ActionRequest) -> Enqueued:
        """Enqueue in ``conn``'s current transaction (the caller commits)."""
        now = self._db_now(conn) if self._needs_clock([request]) else None
        prepared = self.prepare(request, now=now)
        row = conn.execute(self.queries["enqueue"], self._single_params(prepared)).fetchone()
        if row is not None:
            return Enqueued(int(row[0]), True)
        rows = conn.execute(self.queries["find_by_keys"], {"keys": [request.idempotency_key]})
        return self._existing_one(prepared, rows.fetchall())

    async def aenqueue(self, conn: AsyncConnection[Any], request: ActionRequest) -> Enqueued:
        """The async twin of :meth:`enqueue`."""
        now = await self._adb_now(conn) if self._needs_clock([request]) else None
        prepared = self.prepare(request, now=now)
        cursor = await conn.execute(self.queries["enqueue"], self._single_params(prepared))
        row = await cursor.fetchone()
        if row is not None:
            return Enqueued(int(row[0]), True)
        cursor = await conn.execute(
            self.queries["find_by_keys"], {"keys": [request.idempotency_key]}
        )
        return self._existing_one(prepared, await cursor.fetchall())

    def _existing_one(self, prepared: _Prepared, rows: list[tuple[Any, ...]]) -> Enqueued:
        found = self._check_existing([prepared], rows)
        if prepared.request.idempotency_key not in found:
            # Only possible when the conflicting insert is invisible to this transaction's
            # snapshot (REPEATABLE READ callers); PostgreSQL reports that as a serialization
            # failure first, so reaching here means the row vanished (an erasure).
            raise InvalidRequest(
                "idempotency_key",
                f"{prepared.request.idempotency_key!r} conflicted with an action that is gone; "
                "retry",
            )
        return Enqueued(found[prepared.request.idempotency_key], False)

    def enqueue_many(
        self, conn: Connection[Any], requests: Sequence[ActionRequest]
    ) -> list[Enqueued]:
        """Enqueue many requests in one round trip; the answers are in request order."""
        if not requests:
            return []
        now = self._db_now(conn) if self._needs_clock(requests) else None
        prepared = [self.prepare(request, now=now) for request in requests]
        self._refuse_inner_conflicts(prepared)
        # A savepoint: a key that turns out to name another effect undoes the whole batch.
        with _savepoint(conn):
            rows = conn.execute(
                self.queries["enqueue_many"], self._many_params(prepared)
            ).fetchall()
            created = {key: action_id for key, action_id, _ in rows}
            missing = [
                p.request.idempotency_key
                for p in prepared
                if p.request.idempotency_key not in created
            ]
            existing: dict[str, int] = {}
            if missing:
                found = conn.execute(self.queries["find_by_keys"], {"keys": missing}).fetchall()
                existing = self._check_existing(prepared, found)
        return self._answers(prepared, created, existing)

    async def aenqueue_many(
        self, conn: AsyncConnection[Any], requests: Sequence[ActionRequest]
    ) -> list[Enqueued]:
        """The async twin of :meth:`enqueue_many`."""
        if not requests:
            return []
        now = await self._adb_now(conn) if self._needs_clock(requests) else None
        prepared = [self.prepare(request, now=now) for request in requests]
        self._refuse_inner_conflicts(prepared)
        async with _asavepoint(conn):
            cursor = await conn.execute(self.queries["enqueue_many"], self._many_params(prepared))
            created = {key: action_id for key, action_id, _ in await cursor.fetchall()}
            missing = [
                p.request.idempotency_key
                for p in prepared
                if p.request.idempotency_key not in created
            ]
            existing: dict[str, int] = {}
            if missing:
                cursor = await conn.execute(self.queries["find_by_keys"], {"keys": missing})
                existing = self._check_existing(prepared, await cursor.fetchall())
        return self._answers(prepared, created, existing)

    @staticmethod
    def _refuse_inner_conflicts(prepared: Sequence[_Prepared]) -> None:
        seen: dict[str, ActionRequest] = {}
        for item in prepared:
            request = item.request
            first = seen.setdefault(request.idempotency_key, request)
            if first.kind != request.kind or first.lane_key != request.lane_key:
                raise IdempotencyConflict(
                    "idempotency_key",
                    f"{request.idempotency_key!r} is used twice in this batch for different "
                    f"effects ({first.kind} in {first.lane_key!r}, {request.kind} in "
                    f"{request.lane_key!r})",
                )

    @staticmethod
    def _answers(
        prepared: Sequence[_Prepared], created: dict[str, int], existing: dict[str, int]
    ) -> list[Enqueued]:
        answers = []
        handed: set[str] = set()
        for item in prepared:
            key = item.request.idempotency_key
            if key in created and key not in handed:
                answers.append(Enqueued(created[key], True))
                handed.add(key)
            else:
                answers.append(Enqueued(created.get(key) or existing[key], False))
        return answers

    def _db_now(self, conn: Connection[Any]) -> datetime:
        row = conn.execute(self.queries["database_now"]).fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    async def _adb_now(self, conn: AsyncConnection[Any]) -> datetime:
        cursor = await conn.execute(self.queries["database_now"])
        row = await cursor.fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    # -- proposals and cancellation ------------------------------------------------------------

    def admit(self, conn: Connection[Any], action_id: int) -> bool:
        """PROPOSED -> ADMITTED; False when the action is not a proposal (any more)."""
        row = conn.execute(
            self.queries["admit"], {"id": action_id, "channel": self.channel}
        ).fetchone()
        return row is not None

    async def cancel(
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

        async def cancel_action() -> tuple[Any, ...] | None:
            await conn.execute(self.queries["lock_action_lane"], {"id": action_id})
            await conn.execute(self.queries["lock_action"], {"id": action_id})
            cursor = await conn.execute(
                self.queries["cancel_unstarted"], {"id": action_id, "reason": reason}
            )
            row = await cursor.fetchone()
            if row is not None:
                await conn.execute(self.queries["lower_lanes_wait"], {"lanes": [row[3]]})
            return row

        row = await lanes_first(
            conn,
            cancel_action,
            what=f"cancel of action {action_id}",
            wait_seconds=lock_wait_seconds,
        )
        if row is None:
            return None
        action = Action.from_row(row)
        if action.kind in self.registry:
            adapter = self.registry.get(action.kind).adapter.build(self.settings)
            await adapter.ended(conn, action)
        return action

    # -- reads ---------------------------------------------------------------------------------

    def get(self, conn: Connection[Any], action_id: int) -> Action | None:
        row = conn.execute(self.queries["action_by_id"], {"id": action_id}).fetchone()
        return None if row is None else Action.from_row(row)

    def lane(
        self, conn: Connection[Any], lane_key: str, *, live_only: bool = True, decode: bool = True
    ) -> list[Action]:
        """Every action of one lane, unfiltered. With ``decode`` (the default) an action of a
        kind or variant this build cannot decode raises :class:`UndecodableAction`."""
        rows = conn.execute(
            self.queries["lane_actions"], {"lane_key": lane_key, "live_only": live_only}
        ).fetchall()
        actions = [Action.from_row(row) for row in rows]
        if decode:
            for action in actions:
                self.decode(action)
        return actions

    def by_keys(
        self, conn: Connection[Any], keys: Sequence[str], *, decode: bool = True
    ) -> list[Action]:
        """The actions holding these idempotency keys, unfiltered (see :meth:`lane`)."""
        rows = conn.execute(self.queries["actions_by_keys"], {"keys": list(keys)}).fetchall()
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
