"""outbox-core: effects that run exactly when the database change that asked for them commits.

The names in ``__all__`` are the public API, listed with one line each in ``docs/api.md``; so
is the ``outbox_core.testing`` module. Everything else (the submodules and their other names)
is internal and may change in any release.
"""

from .action import Action
from .adapter import ActionAdapter, ConfiguredAdapter, EnqueueCheck, PerLoop
from .attempt import ActionAttempt, LeaseLost, WriteFence
from .erasure import ErasureReport, TableRows, erase_subject, erasing_outbox, preview_erasure
from .errors import (
    AdapterContractError,
    ConfigurationError,
    EgressViolation,
    IdempotencyConflict,
    InvalidFilter,
    InvalidRequest,
    MigrationError,
    OutboxError,
    PluginLoadError,
    PreparedStatementsLost,
    RegistrationError,
    UndecodableAction,
    UnknownKind,
)
from .executor import Executor
from .executor.collector import tune_collector
from .hookspecs import RegistrationContext, hookimpl, hookspec
from .http_headers import provider_clock, retry_after
from .lane_locks import LocksBusy
from .migrations import MigrationLine, migrate
from .observability import action_event, event
from .operator import (
    OperatorRefused,
    resolve_absent,
    resolve_done,
    resolve_retry,
    retry,
)
from .operator_changes import Plan, Resolution, change_many
from .outbox import Outbox, aenqueue, aenqueue_many, default_outbox, enqueue, enqueue_many
from .person_data import PersonDataCatalog
from .plugins import PluginHost, build_host, load_plugins
from .registry import KindRegistry
from .requests import ActionRequest, Enqueued
from .results import (
    Abandoned,
    AdapterResult,
    Cancelled,
    Defer,
    Done,
    Failed,
    Reread,
    Retry,
    StopReason,
    Uncertain,
)
from .search import ActionFilter, Page, afind_actions, amatching_ids, find_actions
from .settings import OutboxSettings
from .settings_section import SectionSettings
from .sqlfiles import package_queries
from .startup import StoppedKind
from .states import ActionState
from .status import StatusReport, collect_status
from .variants import ActionVariants

__all__ = [
    "Abandoned",
    "Action",
    "ActionAdapter",
    "ActionAttempt",
    "ActionFilter",
    "ActionRequest",
    "ActionState",
    "ActionVariants",
    "AdapterContractError",
    "AdapterResult",
    "Cancelled",
    "ConfigurationError",
    "ConfiguredAdapter",
    "Defer",
    "Done",
    "EgressViolation",
    "EnqueueCheck",
    "Enqueued",
    "ErasureReport",
    "Executor",
    "Failed",
    "IdempotencyConflict",
    "InvalidFilter",
    "InvalidRequest",
    "KindRegistry",
    "LeaseLost",
    "LocksBusy",
    "MigrationError",
    "MigrationLine",
    "OperatorRefused",
    "Outbox",
    "OutboxError",
    "OutboxSettings",
    "Page",
    "PerLoop",
    "PersonDataCatalog",
    "Plan",
    "PluginHost",
    "PluginLoadError",
    "PreparedStatementsLost",
    "RegistrationContext",
    "RegistrationError",
    "Reread",
    "Resolution",
    "Retry",
    "SectionSettings",
    "StatusReport",
    "StopReason",
    "StoppedKind",
    "TableRows",
    "Uncertain",
    "UndecodableAction",
    "UnknownKind",
    "WriteFence",
    "action_event",
    "aenqueue",
    "aenqueue_many",
    "afind_actions",
    "amatching_ids",
    "build_host",
    "change_many",
    "collect_status",
    "default_outbox",
    "enqueue",
    "enqueue_many",
    "erase_subject",
    "erasing_outbox",
    "event",
    "find_actions",
    "hookimpl",
    "hookspec",
    "load_plugins",
    "migrate",
    "package_queries",
    "preview_erasure",
    "provider_clock",
    "resolve_absent",
    "resolve_done",
    "resolve_retry",
    "retry",
    "retry_after",
    "tune_collector",
]
