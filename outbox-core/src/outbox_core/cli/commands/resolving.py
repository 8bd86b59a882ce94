"""The operator's decisions about ended actions: `outbox resolve` an UNCERTAIN action (done,
not done, read back again) and `outbox retry` a FAILED or CANCELLED one. Both audited (who,
why, from the CLI), both for many actions at once, named by id or chosen by the filters of
`outbox actions`, with a confirmation for more than one."""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..database import aconnected
from ..group import ACTION_ID, State, command
from ..guard import EXIT_FAILURE, EXIT_USAGE, fail
from .find import filter_given, filter_of, filter_options, refuse_filter

# The most actions a filter may choose unless --max says more.
DEFAULT_MAX = 1000

BY_HELP = "who decides, kept in the audit (default: your OS user name)"
REASON_HELP = "why, kept in the action's audit (required)"


def _decision_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options resolve and retry share: the ids or the filter's options (with --max), and
    --reason, --by, --dry-run, --yes."""
    function = filter_options(function)
    for option in reversed(
        (
            click.option(
                "--max",
                "most",
                type=click.IntRange(min=1),
                metavar="N",
                help=f"with a filter: refuse if more than N actions match (default {DEFAULT_MAX})",
            ),
            click.option("--reason", required=True, metavar="TEXT", help=REASON_HELP),
            click.option("--by", metavar="NAME", help=BY_HELP),
            click.option("--dry-run", is_flag=True, help="show what would change; change nothing"),
            click.option("--yes", is_flag=True, help="no confirmation for more than one action"),
        )
    ):
        function = option(function)
    return function


def _confirmed(count: int, what: str, yes: bool) -> None:
    """More than one action: asked on a terminal unless --yes; refused without one."""
    if count <= 1 or yes:
        return
    if not sys.stdin.isatty():
        fail(f"{what} {count} actions: pass --yes to confirm without a terminal", EXIT_USAGE)
    if not click.confirm(f"{what} {count} actions?", default=False):
        fail("nothing was changed", EXIT_FAILURE)


def _chosen(
    state: State,
    action_ids: Sequence[int],
    fields: dict[str, Any],
    most: int | None,
    how: Any,
) -> list[int]:
    """The ids named, or those the filter options choose among the states that ``how`` acts
    on (at most ``most``); a usage error for both or neither, and one line, exit 1, when none
    or too many match."""
    from ...errors import InvalidFilter
    from ...operator_changes import ACTS_ON, among_acted_on
    from ...search import amatching_ids

    given = filter_given(fields)
    if action_ids and given:
        fail("name the actions by id or by a filter, not both", EXIT_USAGE)
    if most is not None and not given:
        fail("--max goes with a filter", EXIT_USAGE)
    if action_ids:
        return list(action_ids)
    if not given:
        fail(
            "name the actions: ids, or a filter as `outbox actions` takes (--kind, --lane, "
            "--state, ...)",
            EXIT_USAGE,
        )
    try:
        action_filter = among_acted_on(filter_of(fields), how)
    except InvalidFilter as exc:
        refuse_filter(exc)
    bound = most if most is not None else DEFAULT_MAX
    url = state.require_url()
    outbox = state.outbox()

    async def select() -> list[int]:
        async with aconnected(url) as conn:
            return await amatching_ids(conn, outbox, action_filter, bound)

    ids = asyncio.run(select())
    if not ids:
        states = " or ".join(ACTS_ON[how])
        fail(f"no {states} action matches the filter: nothing was changed")
    if len(ids) > bound:
        fail(
            f"more than {bound} actions match the filter: nothing was changed (narrow it, or "
            "raise --max)"
        )
    return ids


def _run(
    state: State,
    ids: Sequence[int],
    how: Any,
    reason: str,
    by: str | None,
    ref: str | None,
    dry_run: bool,
) -> Any:
    from ...operator_changes import change_many

    url = state.require_url()
    outbox = state.outbox()

    async def go() -> Any:
        async with aconnected(url) as conn:
            return await change_many(
                conn, outbox, list(ids), how, reason, by, ref=ref, surface="cli", dry_run=dry_run
            )

    return asyncio.run(go())


def _report(plan: Any, dry_run: bool) -> None:
    verb = "would change" if dry_run or not plan.written else "changed"
    for change in plan.changes:
        line = f"{verb} action {change.action_id} ({change.kind}): {change.before}"
        if change.new_key is not None:
            made = change.new_action
            into = f"action {made.id}" if made is not None else "a new action"
            line += f", run again as {into} with key {change.new_key}"
        else:
            line += f" -> {change.after}"
        click.echo(line)
    if plan.refusals:
        for refusal in plan.refusals:
            click.echo(f"refused: {refusal.why}", err=True)
        fail(f"{len(plan.refusals)} of the actions refused: nothing was changed")


@command()
@click.argument("action_ids", nargs=-1, type=ACTION_ID, metavar="[ID...]")
@click.option("--done", "done", is_flag=True, help="the effect exists (give --ref)")
@click.option("--ref", metavar="REF", help="the provider's reference of the effect found")
@click.option(
    "--not-done", "not_done", is_flag=True, help="the effect does not exist: FAILED RESOLVED_ABSENT"
)
@click.option(
    "--retry",
    "read_back",
    is_flag=True,
    help="read back again, as after a lost lease (only a kind that reads back)",
)
@_decision_options
def resolve(
    state: State,
    action_ids: tuple[int, ...],
    done: bool,
    ref: str | None,
    not_done: bool,
    read_back: bool,
    reason: str,
    by: str | None,
    dry_run: bool,
    yes: bool,
    most: int | None,
    **fields: Any,
) -> None:
    """Decide an UNCERTAIN action after checking the provider: --done --ref REF (the effect
    exists: DONE, RESOLVED_DONE), --not-done (it does not: FAILED, RESOLVED_ABSENT; then
    `outbox retry` may run it again) or --retry (a read-back kind reads back again; never a
    blind write). The kind's `ended` runs for --done and --not-done. Name the actions by id, or
    choose the UNCERTAIN ones by the filters of `outbox actions` (--dry-run shows them first).
    docs/operations.md, "An action is UNCERTAIN", says how to check each kind."""
    from ...operator_changes import Resolution

    chosen = [
        flag
        for flag, on in (("--done", done), ("--not-done", not_done), ("--retry", read_back))
        if on
    ]
    if len(chosen) != 1:
        fail("choose one of --done --ref REF, --not-done or --retry", EXIT_USAGE)
    if done and ref is None:
        fail("--done needs --ref REF, the provider's reference of the effect found", EXIT_USAGE)
    if ref is not None and not done:
        fail("--ref goes with --done", EXIT_USAGE)
    if done and len(action_ids) > 1:
        fail("--done --ref names one effect: resolve one action at a time", EXIT_USAGE)
    how = Resolution.DONE if done else Resolution.ABSENT if not_done else Resolution.READ_BACK
    ids = _chosen(state, action_ids, fields, most, how)
    if done and len(ids) > 1:
        fail(
            f"--done --ref names one effect, and the filter matches {len(ids)} actions: resolve "
            "one action at a time"
        )
    if not dry_run:
        _confirmed(len(set(ids)), "resolve", yes)
    plan = _run(state, ids, how, reason, by or getpass.getuser(), ref, dry_run)
    _report(plan, dry_run)


@command()
@click.argument("action_ids", nargs=-1, type=ACTION_ID, metavar="[ID...]")
@_decision_options
def retry(
    state: State,
    action_ids: tuple[int, ...],
    reason: str,
    by: str | None,
    dry_run: bool,
    yes: bool,
    most: int | None,
    **fields: Any,
) -> None:
    """Run a FAILED or CANCELLED action again: a new action with the same kind, payload, lane
    and subject, key <key>#retry-<n>, linked to the old one in the audit. Refused for an
    UNCERTAIN action (resolve it first), for an at-most-once kind whose write started, and
    once retention or an erasure took the payload. Name the actions by id, or choose FAILED and
    CANCELLED ones by the filters of `outbox actions` (--dry-run shows them first)."""
    from ...operator_changes import Resolution

    ids = _chosen(state, action_ids, fields, most, Resolution.RETRY)
    if not dry_run:
        _confirmed(len(set(ids)), "run again", yes)
    plan = _run(state, ids, Resolution.RETRY, reason, by or getpass.getuser(), None, dry_run)
    _report(plan, dry_run)
