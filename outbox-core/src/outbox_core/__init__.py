"""outbox-core: effects that run exactly when the database change that asked for them commits."""

from .action import Action
from .adapter import ActionAdapter
from .attempt import ActionAttempt, WriteFence
from .errors import (
    AdapterContractError,
    ConfigurationError,
    EgressViolation,
    IdempotencyConflict,
    InvalidRequest,
    MigrationError,
    OutboxError,
    PluginLoadError,
    RegistrationError,
    UndecodableAction,
    UnknownKind,
)
from .hookspecs import hookimpl
from .migrations import MigrationLine
from .outbox import Outbox, aenqueue, aenqueue_many, default_outbox, enqueue, enqueue_many
from .plugins import load_plugins
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
from .settings import OutboxSettings
from .states import ActionState
from .variants import ActionVariants

__all__ = [
    "Abandoned",
    "Action",
    "ActionAdapter",
    "ActionAttempt",
    "ActionRequest",
    "ActionState",
    "ActionVariants",
    "AdapterContractError",
    "AdapterResult",
    "Cancelled",
    "ConfigurationError",
    "Defer",
    "Done",
    "EgressViolation",
    "Enqueued",
    "Failed",
    "IdempotencyConflict",
    "InvalidRequest",
    "KindRegistry",
    "MigrationError",
    "MigrationLine",
    "Outbox",
    "OutboxError",
    "OutboxSettings",
    "PluginLoadError",
    "RegistrationError",
    "Reread",
    "Retry",
    "StopReason",
    "Uncertain",
    "UndecodableAction",
    "UnknownKind",
    "WriteFence",
    "aenqueue",
    "aenqueue_many",
    "default_outbox",
    "enqueue",
    "enqueue_many",
    "hookimpl",
    "load_plugins",
]
