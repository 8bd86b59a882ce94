"""The conformance checks (one module, a little over 550 lines, so that the contract reads as one
page): each a function of a :class:`ConformanceTarget` that raises
:class:`ConformanceFailure` naming the rule the adapter broke.

Each check runs real actions through the real executor (``drain``) against the target's
loopback provider, provokes one situation (a refused fence, an exception at the fence, a write
whose answer is lost, a crash after the fence or after the call), and asserts what the
specification says must follow, by the kind's profile (read-back, at-most-once, or writes
nothing outside). Every check also keeps the rules of every run (:meth:`Run.verify`): the
first ``begin_write()`` of an action comes before its first write, no request reaches the
provider while ``attempt.transaction()`` is open or while ``ended`` runs, every stop reason is
declared, no log record and no result's detail kept on an action holds the payload's canary,
and every ``Reread``, ``Defer`` and ``Failed`` carries a detail.
"""

from __future__ import annotations

from asyncio import CancelledError
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ...errors import InvalidRequest
from ...operator_changes import Resolution
from ...results import Abandoned, StopReason
from ...states import ActionState
from ...variants import ActionVariants
from .run import Run, misnamed_stop_reasons
from .target import ConformanceFailure, ConformanceTarget, Profile

DONE, ADMITTED, EXECUTING = ActionState.DONE, ActionState.ADMITTED, ActionState.EXECUTING
UNCERTAIN, FAILED, CANCELLED = ActionState.UNCERTAIN, ActionState.FAILED, ActionState.CANCELLED


def _done_once(run: Run, action_id: int, rule: str) -> None:
    state, reason, _, _ = run.state(action_id)
    run.expect(state is DONE, rule, f"action {action_id} is {state} ({reason}), not DONE")
    writes = run.writes(action_id)
    if run.profile is Profile.NOTHING_OUTSIDE:
        run.expect(writes >= 1, rule, f"action {action_id} is DONE and the provider served no call")
    else:
        run.expect(writes == 1, rule, f"the provider holds {writes} writes of action {action_id}")


def fence_comes_before_every_write(target: ConformanceTarget) -> None:
    """The adapter calls ``begin_write()`` before its provider write; a kind that writes
    nothing outside calls none."""
    with Run(target) as run:
        action_id = run.enqueue("fenced")
        run.drain()
        _done_once(run, action_id, "a valid request, the provider well, ends DONE with one write")
        if run.profile is not Profile.NOTHING_OUTSIDE:
            run.expect(
                bool(run.fences_of(action_id)),
                "begin_write() comes before any provider write",
                "the attempt wrote and ended DONE without calling begin_write()",
            )


def nothing_is_written_when_the_fence_refuses(target: ConformanceTarget) -> None:
    """Another claim took the action just before its fence: ``begin_write()`` refuses, and the
    adapter returns ``Abandoned()`` without writing."""
    with Run(target) as run:
        if run.profile is Profile.NOTHING_OUTSIDE:
            action_id = run.enqueue("unfenced")
            run.drain()
            _done_once(run, action_id, "a kind that writes nothing outside needs no fence")
            return
        run.break_fence("refuse")
        action_id = run.enqueue("refused")
        run.drain()
        attempts, fences = run.attempts_of(action_id), run.fences_of(action_id)
        run.expect(bool(fences), "begin_write() comes before any provider write", "never called")
        run.expect(fences[0].passed is False, "(the suite) the moved epoch makes the fence refuse")
        result = attempts[0].result if attempts else None
        run.expect(
            isinstance(result, Abandoned),
            "when begin_write() refuses, the adapter returns Abandoned()",
            f"it returned {result!r}",
        )
        run.expect(
            run.writes(action_id) == 0,
            "nothing is written when the fence refuses",
            f"the provider holds {run.writes(action_id)} write(s) after a refused fence",
        )


def an_exception_before_the_fence_is_a_retry(target: ConformanceTarget) -> None:
    """An exception before the fence (here: at ``begin_write()`` itself) makes the action
    wait for a retry, the provider holding nothing; a write the provider refused before it
    recorded it is retried too. Both are carried out once later. A kind that writes nothing
    outside: a call whose answer was lost is retried, and the repeated call is harmless."""
    with Run(target) as run:
        scenarios: list[tuple[str, Callable[[], None], str]]
        if run.profile is Profile.NOTHING_OUTSIDE:
            scenarios = [
                (
                    "lost",
                    lambda: run.fault("drop"),
                    "a lost answer of a kind that writes nothing outside is a retry",
                ),
            ]
        else:
            scenarios = [
                (
                    "raised",
                    lambda: run.break_fence("raise"),
                    "an exception before the fence is a retry",
                ),
                (
                    "refused-write",
                    lambda: run.fault("refuse"),
                    "a write the provider refused before recording it is retried",
                ),
            ]
        for label, provoke, rule in scenarios:
            provoke()
            action_id = run.enqueue(label)
            run.drain()
            state, reason, _, started = run.state(action_id)
            run.expect(
                state is ADMITTED and not started,
                rule,
                f"action {action_id} is {state} ({reason}), write started: {started}",
            )
            if run.profile is not Profile.NOTHING_OUTSIDE:
                run.expect(
                    run.writes(action_id) == 0,
                    rule,
                    f"the provider holds {run.writes(action_id)} write(s) of action {action_id}",
                )
            run.drain()
            _done_once(run, action_id, f"{rule}, and the retry is carried out once")


def an_exception_after_the_fence_is_a_reread_or_uncertain(target: ConformanceTarget) -> None:
    """The provider recorded the write, then dropped the connection (or never answered, until
    the adapter's own timeout): a read-back kind waits with its fence (``Reread``) and its next
    attempt finds the write; an at-most-once kind ends ``UNCERTAIN`` and is never sent again.
    The provider holds at most one effect."""
    with Run(target) as run:
        for fault in ("drop", "stall"):
            run.fault(fault)
            action_id = run.enqueue(fault)
            run.drain(timeout=_stall_timeout(run))
            state, reason, _, started = run.state(action_id)
            writes = run.writes(action_id)
            if run.profile is Profile.NOTHING_OUTSIDE:
                run.expect(
                    state is ADMITTED,
                    "a lost answer of a kind that writes nothing outside is a retry",
                    f"after a {fault}, action {action_id} is {state} ({reason})",
                )
                run.drain()
                _done_once(run, action_id, "a repeated call of a kind that writes nothing outside")
                continue
            run.expect(
                writes <= 1, "the provider holds at most one effect", f"{writes} after a {fault}"
            )
            if run.profile is Profile.READ_BACK:
                run.expect(
                    state is EXECUTING and started,
                    "after the fence, a lost answer of a read-back kind is a Reread",
                    f"after a {fault}, action {action_id} is {state} ({reason}), "
                    f"write started: {started}",
                )
                run.drain()
                _done_once(
                    run,
                    action_id,
                    "the attempt after a started write reads back first and never writes twice",
                )
            else:
                run.expect(
                    state is UNCERTAIN,
                    "after the fence, a lost answer of an at-most-once kind is UNCERTAIN",
                    f"after a {fault}, action {action_id} is {state} ({reason})",
                )
                run.drain()
                attempts = len(run.attempts_of(action_id))
                run.expect(
                    attempts == 1,
                    "an at-most-once action whose write started is never sent again",
                    f"{attempts} attempts",
                )
            cut = [r for r in run.attempts_of(action_id) if isinstance(r.result, CancelledError)]
            run.expect(
                not cut,
                "the adapter's own timeout ends a provider call that gets no answer",
                "the executor's watchdog had to cancel the attempt at the end of its lease",
            )


def an_attempt_after_a_started_write_reads_back_first(target: ConformanceTarget) -> None:
    """A process died after an attempt's fence (nothing written) or after its provider call
    (written, its ending lost), and the lease ran out. A read-back kind's next attempt, which
    starts with ``write_started``, reads back: it writes when nothing is there and never
    writes twice. An at-most-once kind is never claimed again: the reaper ends it UNCERTAIN.
    A kind that writes nothing outside simply calls again."""
    with Run(target) as run:
        if run.profile is not Profile.NOTHING_OUTSIDE:
            run.break_fence("crash")
            action_id = run.enqueue("crash-after-fence")
            run.drain()
            state, _, _, started = run.state(action_id)
            run.expect(state is EXECUTING and started, "(the suite) a crash after the fence")
            run.end_lease(action_id)
            run.drain()
            _after_crash(run, action_id, written=False)
        run.crash_after_the_attempt()
        action_id = run.enqueue("crash-after-call")
        run.drain()
        state, _, _, _ = run.state(action_id)
        run.expect(state is EXECUTING, "(the suite) a crash after the provider call")
        run.end_lease(action_id)
        run.drain()
        _after_crash(run, action_id, written=True)


def _after_crash(run: Run, action_id: int, *, written: bool) -> None:
    attempts = run.attempts_of(action_id)
    state, reason, _, _ = run.state(action_id)
    match run.profile:
        case Profile.READ_BACK:
            run.expect(
                len(attempts) == 2 and attempts[1].write_started,
                "(the suite) the next attempt starts with write_started",
                f"{len(attempts)} attempts",
            )
            if not written and not run.adapter.writes_again_when_absent:
                rule = (
                    "an attempt that starts with write_started only reads: finding nothing, it "
                    "ends CANCELLED ABSENT and writes nothing"
                )
                writes = run.writes(action_id)
                run.expect(
                    state is CANCELLED and reason == StopReason.ABSENT and writes == 0,
                    rule,
                    f"it is {state} ({reason}) with {writes} write(s)",
                )
                return
            rule = (
                "an attempt that starts with write_started reads back first and never writes twice"
                if written
                else "an attempt that starts with write_started and finds nothing writes once"
            )
            _done_once(run, action_id, rule)
        case Profile.AT_MOST_ONCE:
            run.expect(
                len(attempts) == 1,
                "an at-most-once kind is never claimed again after its write started",
                f"{len(attempts)} attempts",
            )
            run.expect(
                state is UNCERTAIN and reason == StopReason.LEASE_LOST_AFTER_WRITE,
                "an at-most-once action whose lease ran out after its write started ends "
                "UNCERTAIN, LEASE_LOST_AFTER_WRITE",
                f"it is {state} ({reason})",
            )
            writes = run.writes(action_id)
            run.expect(
                writes == (1 if written else 0),
                "the provider holds at most one effect",
                f"{writes} write(s)",
            )
        case Profile.NOTHING_OUTSIDE:
            _done_once(run, action_id, "a repeated attempt of a kind that writes nothing outside")


def a_read_back_outage_spends_no_attempt(target: ConformanceTarget) -> None:
    """A read-back kind's write lost its answer, and then the provider cannot be read for
    longer than the action's attempts would last (twice its two attempts): each attempt that
    only reads returns ``Reread`` without calling ``begin_write()``, spends no attempt and
    leaves the action EXECUTING (reads are bounded by the kind's ``unreadable_for``, not by
    attempts); once the provider is readable again, the next attempt finds the write, DONE
    with one effect. Left out for a provider without a read of its own (its
    ``fault("unreadable")`` raises NotImplementedError: writing again is its read-back)."""
    with Run(target) as run:
        if run.profile is not Profile.READ_BACK:
            return
        run.fault("drop")
        action_id = run.enqueue("outage", max_attempts=2)
        run.drain()
        state, reason, counted, started = run.state(action_id)
        run.expect(
            state is EXECUTING and started,
            "after the fence, a lost answer of a read-back kind is a Reread",
            f"action {action_id} is {state} ({reason}), write started: {started}",
        )
        fences = len(run.fences_of(action_id))
        if not run.unreadable():
            return  # writing again is this kind's read-back: its Rereads all count
        try:
            for read in range(1, 5):
                run.drain()
                state, reason, now_counted, _ = run.state(action_id)
                hint = (
                    "the loopback provider's fault('unreadable') must fail every read-back "
                    "until clear_faults() (or raise NotImplementedError when writing again is "
                    "the kind's read-back)"
                    if state is DONE
                    else "return Reread(detail=...) when a read fails, without begin_write()"
                )
                run.expect(
                    state is EXECUTING,
                    "a read-back outage does not end the action before the kind's "
                    "unreadable_for has passed",
                    f"after {read} read(s) with the provider unreadable, action {action_id} is "
                    f"{state} ({reason}): {hint}",
                )
                run.expect(
                    len(run.fences_of(action_id)) == fences,
                    "an attempt that only reads back calls no begin_write(), so its Reread "
                    "spends no attempt",
                    f"an attempt of action {action_id} fenced while the provider was unreadable",
                )
                run.expect(
                    now_counted == counted,
                    "an attempt that only reads back spends no attempt",
                    f"action {action_id} counted {now_counted} attempts after {read} read(s), "
                    f"{counted} before them",
                )
        finally:
            run.readable()
        run.drain()
        _done_once(run, action_id, "once the provider is readable again, the write is found")


def rereads_defers_and_failures_carry_a_detail(target: ConformanceTarget) -> None:
    """Every ``Reread``, ``Defer`` and ``Failed`` the adapter returns says in ``detail`` what
    the attempt saw (kept as the action's ``last_detail``): here after a lost answer, during a
    read-back outage (read-back kinds) and after a refused write at the last attempt; the rule
    also holds in every other check's run."""
    with Run(target) as run:
        run.fault("drop")
        lost = run.enqueue("detail-lost", max_attempts=2)
        run.drain()
        outage = run.profile is Profile.READ_BACK and run.state(lost)[0] is EXECUTING
        if outage and run.unreadable():
            try:
                run.drain()
            finally:
                run.readable()
        run.drain()
        run.fault("refuse")
        run.enqueue("detail-refused", max_attempts=1)
        run.drain()
        run.verify_results_carry_details()


def variants_and_stop_reasons_are_declared(target: ConformanceTarget) -> None:
    """``variants()`` is declared and enqueue refuses a payload outside it, writing nothing;
    the adapter's stop reasons are declared upper-case names, and every stop reason its
    actions end with (here: a refused write at the last attempt) is one of them or the core's."""
    with Run(target) as run:
        variants = run.adapter.variants()
        run.expect(isinstance(variants, ActionVariants), "variants() returns ActionVariants")
        misnamed = misnamed_stop_reasons(run.adapter)
        run.expect(not misnamed, "declared stop reasons are upper-case names", f"{misnamed}")
        payloads = [*_outside(variants), *target.invalid_payloads]
        run.expect(
            bool(payloads),
            "the suite needs a payload outside variants()",
            "its declared model accepts any object: give ConformanceTarget(invalid_payloads=)",
        )
        for payload in payloads:
            request = run.request("outside", payload=payload)
            with run.db.connect() as conn:
                try:
                    run.db.outbox.enqueue(conn, request)
                except InvalidRequest:
                    conn.rollback()
                else:
                    conn.rollback()
                    run.expect(False, "enqueue refuses a payload outside variants()", f"{payload}")
        stored = run.db.scalar(
            "SELECT count(*) FROM {schema}.agent_action WHERE idempotency_key LIKE %s",
            ("conformance:outside:%",),
        )
        run.expect(stored == 0, "a refused enqueue writes nothing", f"{stored} rows")
        run.fault("refuse")
        action_id = run.enqueue("last-attempt", max_attempts=1)
        run.drain()
        state, reason, _, _ = run.state(action_id)
        run.expect(
            state is FAILED,
            "a write refused at the last attempt ends FAILED",
            f"it is {state} ({reason})",
        )
        run.verify_stop_reasons()


def _outside(variants: ActionVariants) -> list[Mapping[str, Any]]:
    """Payloads that the declaration refuses: an unknown tag, or no required fields."""
    if variants.shape == "tagged":
        assert variants.tag is not None and variants.body is not None
        return [{variants.tag: "outbox-conformance-unknown-variant", variants.body: {}}]
    model = variants.model
    if model is not None and any(field.is_required() for field in model.model_fields.values()):
        return [{}]
    return []


def ended_runs_for_every_ending_and_calls_no_provider(target: ConformanceTarget) -> None:
    """``ended`` runs once, in the ending's transaction, for each way an action ends (done,
    failed, expired, cancelled, uncertain, ended by the reaper), and no request reaches the
    provider while it runs."""
    with Run(target) as run:

        def drain(action_id: int) -> None:
            run.drain()

        def expire(action_id: int) -> None:
            run.pass_expiry(action_id)
            run.drain()

        def cancel(action_id: int) -> None:
            run.cancel(action_id)

        def reap(action_id: int) -> None:
            run.drain()
            run.end_lease(action_id)
            run.drain()

        def crash_after_fence() -> None:
            run.break_fence("crash")

        once = {"max_attempts": 1}
        ways: list[tuple[str, Callable[[int], None], dict[str, Any], Callable[[], None] | None]]
        ways = [
            ("done", drain, {}, None),
            ("failed", drain, once, lambda: run.fault("refuse")),
            ("expired", expire, _expiring(), None),
            ("cancelled", cancel, {}, None),
        ]
        if run.profile is Profile.NOTHING_OUTSIDE:
            ways.append(("reaper", reap, once, run.crash_after_the_attempt))
        else:
            ways.append(("uncertain", drain, once, lambda: run.fault("drop")))
            ways.append(("reaper", reap, once, crash_after_fence))
        for label, end, changes, provoke in ways:
            if provoke is not None:
                provoke()
            action_id = run.enqueue(label, **changes)
            end(action_id)
            state, reason, _, _ = run.state(action_id)
            run.expect(state.ended, f"(the suite) the {label} way ends the action", f"{state}")
            calls = run.endings_of(action_id)
            run.expect(
                len(calls) == 1 and calls[0].state is state,
                "ended() runs once for each way an action ends",
                f"the {label} way ({state}, {reason}) called it {len(calls)} time(s)",
            )


def ended_handles_a_resolution(target: ConformanceTarget) -> None:
    """``ended`` runs again, in the resolution's transaction, when an operator resolves an
    UNCERTAIN action (``outbox resolve --done`` and ``--not-done``), sees the resolved state,
    stop reason and reference, and calls no provider. A kind that writes nothing outside never
    ends UNCERTAIN, and is not checked."""
    if Profile.of(target.db.registry.get(target.kind).adapter) is Profile.NOTHING_OUTSIDE:
        return
    with Run(target) as run:
        resolutions = [
            ("done", Resolution.DONE, target.resolved_ref, DONE, StopReason.RESOLVED_DONE),
            ("absent", Resolution.ABSENT, None, FAILED, StopReason.RESOLVED_ABSENT),
        ]
        for label, how, ref, state, reason in resolutions:
            run.fault("drop")
            action_id = run.enqueue(f"resolve-{label}", max_attempts=1)
            run.drain()
            ended, _, _, _ = run.state(action_id)
            run.expect(
                ended is UNCERTAIN, "(the suite) a dropped answer ends UNCERTAIN", f"{ended}"
            )
            try:
                run.resolve(action_id, how, ref)
            except Exception as exc:
                raise ConformanceFailure(
                    f"ended() handles an operator's resolution: resolving {label} raised {exc!r}"
                ) from exc
            calls = run.endings_of(action_id)
            last = calls[-1] if calls else None
            run.expect(
                last is not None and (last.state, last.stop_reason) == (state, reason),
                "ended() runs for an operator's resolution",
                f"resolved {label}: its calls were {[(c.state, c.stop_reason) for c in calls]}",
            )


def _expiring() -> dict[str, Any]:
    return {"expires_at": datetime.now(UTC) + timedelta(hours=1)}


def no_provider_request_inside_the_attempt_transaction(target: ConformanceTarget) -> None:
    """No provider request arrives while ``attempt.transaction()`` is open, and the adapter
    declares its provider timeout (``provider_timeout_seconds``), below the fence margin (for a
    kind that writes nothing outside, below the lease)."""
    with Run(target) as run:
        action_id = run.enqueue("transaction")
        run.drain()
        _done_once(run, action_id, "a valid request, the provider well, ends DONE")
        run.crash_after_the_attempt()
        action_id = run.enqueue("transaction-again")
        run.drain()
        run.end_lease(action_id)
        run.drain()
        run.verify_no_request_in_transaction()
        run.expect(bool(run.recorder.instances), "(the suite) the executor ran the adapter")
        adapter = run.recorder.instances[0]
        timeout = adapter.provider_timeout_seconds
        settings = run.db.settings
        run.expect(
            timeout is not None and timeout > 0,
            "the adapter declares its provider timeout",
            f"set {type(adapter).__qualname__}.provider_timeout_seconds (class or instance) to the "
            "longest a provider call of an attempt can take",
        )
        assert timeout is not None
        if run.profile is Profile.NOTHING_OUTSIDE:
            run.expect(
                timeout < settings.lease_seconds,
                "the provider timeout is below the lease",
                f"{timeout} s against a lease of {settings.lease_seconds} s",
            )
        else:
            run.expect(
                timeout < settings.fence_margin_seconds,
                "the provider timeout is below the fence margin (the call ends within the lease "
                "that begin_write() guarantees)",
                f"{timeout} s against a margin of {settings.fence_margin_seconds} s",
            )


def no_payload_value_in_log_records(target: ConformanceTarget) -> None:
    """No log record that an attempt emits, at any level, holds a value of the payload, and
    neither does the detail its result leaves on the action: a canary string in the payload is
    looked for in every record and every action of a run that goes well, one whose write is
    refused, and one whose answer is lost."""
    with Run(target) as run:
        run.enqueue("logged")
        run.drain()
        run.fault("refuse")
        run.enqueue("logged-refused", max_attempts=1)
        run.drain()
        run.fault("drop")
        run.enqueue("logged-lost", max_attempts=1)
        run.drain()
        run.expect(bool(run.logs.records), "(the suite) the attempts' log records were captured")
        run.verify_logs()
        run.verify_details()


def _stall_timeout(run: Run) -> float:
    declared = getattr(run.adapter, "provider_timeout_seconds", None)
    return (declared if isinstance(declared, int | float) else 30.0) + 60.0


CHECKS: tuple[Callable[[ConformanceTarget], None], ...] = (
    fence_comes_before_every_write,
    nothing_is_written_when_the_fence_refuses,
    an_exception_before_the_fence_is_a_retry,
    an_exception_after_the_fence_is_a_reread_or_uncertain,
    an_attempt_after_a_started_write_reads_back_first,
    a_read_back_outage_spends_no_attempt,
    rereads_defers_and_failures_carry_a_detail,
    variants_and_stop_reasons_are_declared,
    ended_runs_for_every_ending_and_calls_no_provider,
    ended_handles_a_resolution,
    no_provider_request_inside_the_attempt_transaction,
    no_payload_value_in_log_records,
)
"""Every check, in the order the pytest class runs them."""
