"""Operating actions: `outbox status` (what is due, running, blocked), `show` one action,
`cancel` one that has not started, `run-now` a lane head at once, `erase` an account's actions
and person data."""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
from typing import Any

import click

from ..database import aconnected, connected
from ..group import ACTION_ID, State, command
from ..guard import EXIT_FAILURE, EXIT_USAGE, fail


@command()
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option(
    "--lanes",
    default=20,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="how many blocked lanes to list",
)
def status(state: State, as_json: bool, lanes: int) -> None:
    """Per kind: actions due, executing, the oldest due action's age, uncertain ones, proposals
    waiting for admission, and the lanes that are blocked (a head waiting out a backoff or a
    deferral, a proposal not yet admitted, or a row this build cannot decode) with since when."""
    from ...status import collect_status, print_status

    with connected(state.require_url()) as conn:
        report = collect_status(conn, state.outbox(), lanes=lanes)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        print_status(report)
    if report.stopped:
        fail(
            f"{len(report.stopped)} kind(s) cannot run with these settings: "
            + ", ".join(kind.kind for kind in report.stopped)
            + " (listed above, with the setting to fix)",
            EXIT_USAGE,
        )


@command()
@click.argument("action_id", type=ACTION_ID)
@click.option("--payload", is_flag=True, help="include the payload (it may hold personal data)")
def show(state: State, action_id: int, payload: bool) -> None:
    """Print one action as JSON."""
    with connected(state.require_url()) as conn:
        action = state.outbox().get(conn, action_id)
    if action is None:
        fail(f"no action {action_id}")
    click.echo(json.dumps(action.as_dict(with_payload=payload), indent=2, default=str))


REASON_HELP = "why, kept in the action's audit"
BY_HELP = "who does it, kept in the audit (default: your OS user name)"


@command()
@click.argument("action_id", type=ACTION_ID)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
@click.option("--by", metavar="NAME", help=BY_HELP)
def cancel(state: State, action_id: int, reason: str | None, by: str | None) -> None:
    """Cancel an action that has not started (PROPOSED or ADMITTED); its kind's `ended` runs.
    Audited (who, why, from the CLI) as every operator's change."""
    url = state.require_url()
    outbox = state.outbox()
    from ...operator import cancel_unstarted

    async def go() -> Any:
        async with aconnected(url) as conn:
            return await cancel_unstarted(
                conn, outbox, action_id, reason=reason, by=by or getpass.getuser(), surface="cli"
            )

    cancelled = asyncio.run(go())
    click.echo(f"cancelled action {cancelled.id} ({cancelled.kind} in lane {cancelled.lane_key})")


@command("run-now")
@click.argument("action_id", type=ACTION_ID)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
@click.option("--by", metavar="NAME", help=BY_HELP)
def run_now(state: State, action_id: int, reason: str | None, by: str | None) -> None:
    """Carry out an admitted lane head at once (claimed and fenced as any claim), then print
    how it stands; audited. Refused for an action that is not a claimable head."""
    url = state.require_url()
    outbox = state.outbox()
    from ...operator import run_now as run_action_now

    action = asyncio.run(
        run_action_now(
            outbox, url, action_id, reason=reason, by=by or getpass.getuser(), surface="cli"
        )
    )
    click.echo(
        f"ran action {action.id} ({action.kind} in lane {action.lane_key}): now {action.state}"
    )


@command()
@click.option("--subject", required=True, metavar="ACCOUNT_ID", help="the erased account")
@click.option(
    "--dry-run",
    is_flag=True,
    help="print what would be deleted, counted per table, and delete nothing",
)
@click.option("--yes", is_flag=True, help="on a terminal, erase without asking first")
def erase(state: State, subject: str, dry_run: bool, yes: bool) -> None:
    """Delete every action addressed to an account and erase every package's person data;
    print, as JSON, what went: actions, per catalog, and per table the rows deleted, updated
    and inserted.

    On a terminal it first shows what would go (the --dry-run) and asks; a script (stdin not
    a terminal) erases without asking, as before. --dry-run runs the same erasure and rolls it
    back, so its counts are the erasure's own."""
    from ...erasure import erase_subject, preview_erasure

    url = state.require_url()
    outbox = state.outbox()

    async def preview() -> Any:
        async with aconnected(url) as conn:
            return await preview_erasure(conn, subject, outbox=outbox)

    async def go() -> Any:
        async with aconnected(url) as conn:
            report = await erase_subject(conn, subject, outbox=outbox)
            await conn.commit()
            return report

    if dry_run or (not yes and sys.stdin.isatty()):
        would = asyncio.run(preview())
        click.echo(json.dumps({"subject": subject, "dry_run": True, **would.as_dict()}))
        if dry_run:
            return
        # Asked without holding the subject's lanes: the erasure below runs afresh and prints
        # what it did, which differs from the above only by what changed meanwhile.
        if not click.confirm(f"erase these rows of {subject!r}?", default=False, err=True):
            fail("nothing erased", EXIT_FAILURE)
    report = asyncio.run(go())
    click.echo(json.dumps({"subject": subject, **report.as_dict()}))
