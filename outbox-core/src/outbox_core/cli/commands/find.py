"""Finding actions: `outbox actions` with the filters of :class:`outbox_core.search.ActionFilter`
as options, one bounded page at a time, as a table of 80 columns or as JSON. The filter's
options live here once; the bulk forms of `outbox resolve` and `outbox retry` take them too."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC
from typing import Any, NoReturn

import click

from ...action import Action
from ...errors import InvalidFilter
from ...search import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    ActionFilter,
    Page,
    filter_from_text,
    find_actions,
    parse_limit,
)
from ..database import connected
from ..group import State, command
from ..guard import EXIT_USAGE, fail

# The option that sets each field of the search, for the one-line refusals.
OPTIONS = {
    "kind": "--kind",
    "states": "--state",
    "stop_reason": "--stop-reason",
    "lane_key": "--lane",
    "key": "--key",
    "key_prefix": "--key-prefix",
    "subject": "--subject",
    "workspace": "--workspace",
    "created_since": "--since",
    "created_until": "--until",
    "ended_since": "--ended-since",
    "ended_until": "--ended-until",
    "limit": "--limit",
    "cursor": "--cursor",
}

# The table: (heading, width) per column; the key takes what is left of 80 columns.
_COLUMNS = (("ID", 9), ("STATE", 9), ("KIND", 14), ("LANE", 16), ("CREATED (UTC)", 13))
_WIDTH = 80


# The filter's options, shared by `outbox actions` and the bulk forms of resolve and retry.
_FILTER_OPTIONS = (
    click.option("--kind", metavar="KIND", help="the action's kind (EMAIL)"),
    click.option(
        "--state",
        "states",
        multiple=True,
        metavar="STATE",
        help="its state; repeat it or separate with commas for any of several (FAILED,UNCERTAIN)",
    ),
    click.option("--stop-reason", metavar="REASON", help="how it ended (ATTEMPTS_EXHAUSTED)"),
    click.option("--lane", metavar="LANE", help="its lane key"),
    click.option("--key", metavar="KEY", help="its idempotency key, exactly"),
    click.option("--key-prefix", metavar="PREFIX", help="the start of its idempotency key"),
    click.option("--subject", metavar="ACCOUNT_ID", help="the account it is addressed to"),
    click.option("--workspace", metavar="WORKSPACE_ID", help="its workspace"),
    click.option("--since", metavar="TIME", help="made at or after (2026-12-03T10:00:00Z)"),
    click.option("--until", metavar="TIME", help="made before"),
    click.option("--ended-since", metavar="TIME", help="ended at or after"),
    click.option("--ended-until", metavar="TIME", help="ended before"),
)
# The names click gives the filter's options' values.
FILTER_FIELDS = (
    "kind",
    "states",
    "stop_reason",
    "lane",
    "key",
    "key_prefix",
    "subject",
    "workspace",
    "since",
    "until",
    "ended_since",
    "ended_until",
)


def filter_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Add the search's filter options (--kind ... --ended-until) to a command."""
    for option in reversed(_FILTER_OPTIONS):
        function = option(function)
    return function


def filter_given(fields: dict[str, Any]) -> bool:
    """Whether any filter option was given."""
    return any(fields.get(name) not in (None, ()) for name in FILTER_FIELDS)


def filter_of(fields: dict[str, Any]) -> ActionFilter:
    """The :class:`ActionFilter` of the filter options' values; a wrong one is a usage error
    naming its option."""
    try:
        return _filter(fields)
    except InvalidFilter as exc:
        refuse_filter(exc)


def refuse_filter(exc: InvalidFilter) -> NoReturn:
    """The one-line usage error for a wrong filter field, named by its option."""
    message = str(exc).removeprefix(f"{exc.field}: ")
    fail(f"{OPTIONS.get(exc.field, exc.field)}: {message}", EXIT_USAGE)


@command("actions")
@filter_options
@click.option(
    "--limit", metavar="N", default=str(DEFAULT_LIMIT), help=f"actions a page (1 to {MAX_LIMIT})"
)
@click.option("--cursor", metavar="CURSOR", help="the next page: the cursor the last one printed")
@click.option("--json", "as_json", is_flag=True, help="print the page as JSON")
def actions(state: State, as_json: bool, limit: str, cursor: str | None, **fields: Any) -> None:
    """Find actions, newest first: every filter given must hold. A page reads at most a bounded
    window of candidates; when the filter names no indexed field (kind, lane, key, key prefix,
    subject, workspace) a page may say "more may match" before it is full: narrow the filter or
    go on with the cursor it prints."""
    action_filter = filter_of(fields)
    try:
        size = parse_limit(limit)
        with connected(state.require_url()) as conn:
            page = find_actions(conn, state.outbox(), action_filter, size, cursor)
    except InvalidFilter as exc:
        refuse_filter(exc)
    if as_json:
        click.echo(json.dumps(page.as_dict(), indent=2))
    else:
        _print_table(page)


def _filter(fields: dict[str, Any]) -> ActionFilter:
    return filter_from_text(
        {
            "kind": fields["kind"],
            "states": fields["states"],
            "stop_reason": fields["stop_reason"],
            "lane_key": fields["lane"],
            "key": fields["key"],
            "key_prefix": fields["key_prefix"],
            "subject": fields["subject"],
            "workspace": fields["workspace"],
            "created_since": fields["since"],
            "created_until": fields["until"],
            "ended_since": fields["ended_since"],
            "ended_until": fields["ended_until"],
        }
    )


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(action: Action) -> list[str]:
    created = action.created_at.astimezone(UTC)
    return [
        str(action.id),
        str(action.state),
        action.kind,
        action.lane_key,
        created.strftime("%m-%d %H:%M:%S"),
        action.idempotency_key,
    ]


def _print_table(page: Page) -> None:
    key_width = _WIDTH - sum(width + 1 for _, width in _COLUMNS)
    widths = [width for _, width in _COLUMNS] + [key_width]
    lines = [[heading for heading, _ in _COLUMNS] + ["KEY"]]
    lines.extend(_row(action) for action in page.actions)
    for cells in lines:
        shown = [_cell(cell, width).ljust(width) for cell, width in zip(cells, widths, strict=True)]
        click.echo(" ".join(shown).rstrip())
    if not page.actions:
        click.echo("no action matches")
    if page.note is not None:
        click.echo(page.note)
    if page.next_cursor is not None:
        click.echo(f"next page: --cursor {page.next_cursor}")
