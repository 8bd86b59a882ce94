"""How every `outbox` command ends on an error: one line on stderr, exit 1 for a failure and 2
for a wrong option or setting, no traceback for outbox's own errors or a database that was
never migrated."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
import psycopg

from ..errors import ConfigurationError, OutboxError
from ..migrations import MISSING_OBJECT as MISSING_OBJECT

EXIT_USAGE = 2
EXIT_FAILURE = 1


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"outbox: error: {message}", err=True)
    sys.exit(code)


def _missing_object(exc: BaseException) -> psycopg.Error | None:
    """The missing-object error in ``exc``, its causes or (from the executor's tasks) its
    exception group, if any."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, MISSING_OBJECT):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _guard(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn outbox's own errors, and a database that was never migrated, into one line on
    stderr and exit 1; a setting that is wrong (the core's or a plugin's) exits 2, as a wrong
    option does."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ConfigurationError as exc:
            fail(f"configuration: {exc}", EXIT_USAGE)
        except OutboxError as exc:
            fail(str(exc))
        except Exception as exc:
            missing = _missing_object(exc)
            if missing is None:
                raise
            what = missing.diag.message_primary or missing
            fail(
                f"outbox's schema, or a part of it that this build needs, is missing ({what}): "
                "the database was never migrated, or not since this build was installed; run "
                "`outbox migrate`"
            )

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    wrapper.__module__ = function.__module__
    # The options and arguments that click's decorators attached below it stay with it.
    wrapper.__dict__.update(function.__dict__)
    return wrapper
