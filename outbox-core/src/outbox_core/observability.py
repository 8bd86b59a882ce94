"""Metrics (OpenTelemetry API: no-ops until the application configures an SDK) and log events.

Every series is labelled by ``kind``, so a new kind gets its series without a change here.
Log events have stable dotted names and carry ``action.id`` and ``action.kind``, never the
payload. ``docs/metrics.md`` and ``docs/log-records.md`` list them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Observation

logger = logging.getLogger("outbox")

METER_NAME = "outbox"


def event(name: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log the event ``name`` with its fields as record attributes (``extra``)."""
    if logger.isEnabledFor(level):
        details = " ".join(f"{key}={value}" for key, value in fields.items())
        logger.log(
            level,
            "%s %s",
            name,
            details,
            extra={
                "event": name,
                **{key.replace("_", "."): value for key, value in fields.items()},
            },
        )


def database_label(conninfo: str) -> str:
    """``host:port/dbname`` of a connection string, for a log line: never the user's password
    (nor any other parameter)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(conninfo)
    except Exception:
        return "(unparsable)"
    hosts = str(params.get("host") or params.get("hostaddr") or "(local socket)").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:  # one port for every host
        ports = ports * len(hosts)
    named = ",".join(
        f"{host}:{port}" if port else host
        for host, port in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=False)
    )
    return f"{named}/{params.get('dbname') or '(default)'}"


# The attributes every LogRecord has: the rest are the ``extra`` fields of an event.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class TextFormatter(logging.Formatter):
    """``2026-01-31T12:00:00.123Z INFO outbox executor.started kinds=...``: the time in UTC,
    the level, the logger and the message (an event's name and fields), on one line: a
    library's message of several lines (libpq's errors in psycopg.pool's warnings) is joined
    into one. A traceback, when one is attached, follows on its own lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        line = super().formatMessage(record)
        if "\n" not in line:
            return line
        return " ".join(part.strip() for part in line.splitlines() if part.strip())

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _utc(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time``, ``level``, ``logger``, ``message`` and the record's
    ``extra`` fields (``event``, ``action.id``, ``action.kind``, ...); ``exception``, the
    formatted traceback, when one is attached."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        out: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(
            (key, value) for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES
        )
        if record.exc_info and record.exc_info[1] is not None:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _utc(created: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(
    level: str = "INFO", log_format: str = "text", libraries: str = "WARNING"
) -> bool:
    """For a process that runs the executor and nothing else (``outbox run``): when the root
    logger has no handler, install one on stderr (``text`` or ``json``, :class:`TextFormatter`,
    :class:`JsonFormatter`), log outbox's own records (logger ``outbox``) from ``level`` and
    every other logger's (the libraries': httpx's line per request, psycopg.pool's lines per
    connection, slack_sdk's, ...) from ``libraries`` or ``level``, whichever is higher, and
    return True. An application that configured its own logging keeps it (False: nothing is
    changed)."""
    import sys

    root = logging.getLogger()
    if root.handlers:
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root.addHandler(handler)
    own = logging.getLevelName(level.upper())
    quiet = logging.getLevelName(libraries.upper())
    root.setLevel(max(own, quiet))
    logger.setLevel(own)
    if quiet < logging.WARNING:
        # psycopg sets its own logger to WARNING when it is imported: asked for less, it follows.
        logging.getLogger("psycopg").setLevel(logging.NOTSET)
    return True


def action_event(
    name: str, action_id: int, kind: str, *, level: int = logging.INFO, **fields: Any
) -> None:
    """An event about one action: ``action.id`` and ``action.kind`` always, never the payload."""
    if logger.isEnabledFor(level):
        extra = {"event": name, "action.id": action_id, "action.kind": kind}
        extra.update({f"action.{key}": value for key, value in fields.items()})
        details = "".join(f" {key}={value}" for key, value in fields.items())
        logger.log(
            level, "%s action.id=%s action.kind=%s%s", name, action_id, kind, details, extra=extra
        )


def count_ending(kind: str, state: str, stop_reason: str | None) -> None:
    """One ``action.ended`` of an ending outside an executor (an operator's resolution or
    cancel), counted at once in this process's instruments, after its commit."""
    Instruments.shared().ended.add(
        1, {"kind": kind, "state": state, "stop_reason": stop_reason or ""}
    )


class Tally:
    """Counter increments gathered in memory and added once per series when flushed.

    With an OpenTelemetry SDK configured, one ``add`` costs about 6 us here (the attribute set,
    the series lookup, a lock), and the executor counts three things per action: added one by
    one, metrics took more of its CPU than anything else. A batch of 500 endings now adds each
    series once. The executor flushes after every batch it claims or writes, in its
    maintenance loop and when it settles or closes, so a reader sees counts at most one batch
    late."""

    def __init__(self) -> None:
        self._counts: dict[tuple[Counter, tuple[tuple[str, str], ...]], int] = {}

    def add(self, counter: Counter, *attributes: tuple[str, str]) -> None:
        key = (counter, attributes)
        self._counts[key] = self._counts.get(key, 0) + 1

    def flush(self) -> None:
        counts, self._counts = self._counts, {}
        for (counter, attributes), amount in counts.items():
            counter.add(amount, dict(attributes))


@dataclass
class BacklogSnapshot:
    """The last sample of the backlog, read by the observable gauges."""

    due: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    executing: dict[str, int] = field(default_factory=dict)
    oldest_due_age: dict[str, float] = field(default_factory=dict)
    uncertain: dict[str, int] = field(default_factory=dict)
    lanes_blocked: dict[str, int] = field(default_factory=dict)
    proposed: dict[str, int] = field(default_factory=dict)


class Instruments:
    """The instruments of this process: created once (an instrument registered twice under one
    name would keep only its first callback), shared by every executor in the process."""

    _shared: Instruments | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, kinds: Iterable[str] = ()) -> Instruments:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            cls._shared.kinds.update(kinds)
            return cls._shared

    def __init__(self) -> None:
        meter = metrics.get_meter(METER_NAME)
        self.kinds: set[str] = set()
        self.snapshot = BacklogSnapshot()
        self._lock = threading.Lock()
        self.stopped: dict[str, int] = {}
        self.attempts = meter.create_counter(
            "action.attempts",
            unit="{attempt}",
            description="Attempts that ran, by kind and result (Done, Retry, Defer, ...)",
        )
        self.ended = meter.create_counter(
            "action.ended",
            unit="{action}",
            description="Actions that ended, by kind, state and stop reason",
        )
        self.claimed = meter.create_counter(
            "action.claimed", unit="{action}", description="Claims, by kind and op (claim, reclaim)"
        )
        self.fence_refused = meter.create_counter(
            "action.fence.refused", unit="{attempt}", description="begin_write() refusals by kind"
        )
        self.duration = meter.create_histogram(
            "action.attempt.duration", unit="s", description="Time an attempt's execute() took"
        )
        for name, attribute, description in (
            (
                "action.backlog.due",
                "due",
                "Lane heads that could start now (due, or past their lease), by kind",
            ),
            (
                "action.backlog.waiting",
                "waiting",
                "Admitted actions that are not due heads: behind a lane's head, or due later",
            ),
            ("action.backlog.executing", "executing", "Executing actions under a lease, by kind"),
            (
                "action.backlog.oldest_due_age",
                "oldest_due_age",
                "Seconds since the oldest due lane head fell due, by kind",
            ),
            ("action.backlog.uncertain", "uncertain", "Actions that ended UNCERTAIN, by kind"),
            (
                "action.backlog.proposed",
                "proposed",
                "Proposals waiting to be admitted or refused (each holds its lane), by kind",
            ),
            (
                "action.lanes.blocked",
                "lanes_blocked",
                "Lanes whose head waits with actions behind it, by head kind",
            ),
        ):
            meter.create_observable_gauge(
                name, callbacks=[self._observer(attribute)], description=description
            )

        meter.create_observable_gauge(
            "executor.kind.stopped",
            callbacks=[self._observe_stopped],
            description="1 for a kind an executor of this process stopped at start-up (its "
            "adapter could not be built with the settings), 0 for a kind it runs",
        )

    def _observe_stopped(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            stopped = dict(self.stopped)
        return [Observation(value, {"kind": kind}) for kind, value in sorted(stopped.items())]

    def _observer(self, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                values: dict[str, float] = dict(getattr(self.snapshot, attribute))
                kinds = sorted(self.kinds | set(values))
            return [Observation(values.get(kind, 0), {"kind": kind}) for kind in kinds]

        return observe

    def publish_stopped(self, served: Iterable[str], stopped: Iterable[str]) -> None:
        """An executor opened serving ``served``, of which ``stopped`` could not start."""
        names = set(stopped)
        with self._lock:
            for kind in served:
                self.stopped[kind] = 1 if kind in names else 0

    def publish(self, snapshot: BacklogSnapshot) -> None:
        with self._lock:
            self.snapshot = snapshot
