"""The adapter conformance suite, run as a plugin runs it on three sound fixture kinds (one per
profile), and each of its checks shown to fail on an adapter that breaks the check's rule."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from outbox_core import KindRegistry
from outbox_core.errors import RegistrationError
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import (
    AdapterConformance,
    ConformanceFailure,
    ConformanceTarget,
    checks,
)

from . import loopback
from .loopback import LoopbackAdapter, LoopbackServer, target_for


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as running:
        yield running


class LoopbackConformance(AdapterConformance):
    """The suite as a plugin runs it: one fixture, here over one of the fixture adapters."""

    adapter: ClassVar[type[LoopbackAdapter]]

    @pytest.fixture
    def conformance_target(
        self, outbox_db: OutboxTestDatabase, server: LoopbackServer
    ) -> ConformanceTarget:
        return target_for(outbox_db, self.adapter, server)


class TestReadBackKindConforms(LoopbackConformance):
    adapter = loopback.LoopbackAdapter


class TestAtMostOnceKindConforms(LoopbackConformance):
    adapter = loopback.LoopbackOnceAdapter


class TestReadBackKindThatOnlyReadsAfterAnUnknownWriteConforms(LoopbackConformance):
    adapter = loopback.LoopbackReadOnlyAdapter


class TestKindThatWritesNothingOutsideConforms(LoopbackConformance):
    adapter = loopback.LoopbackDraftAdapter


Check = Callable[[ConformanceTarget], None]
BROKEN: list[tuple[type[LoopbackAdapter], Check, str]] = [
    (
        loopback.WritesBeforeTheFence,
        checks.fence_comes_before_every_write,
        "begin_write() comes before any provider write",
    ),
    (
        loopback.DraftThatFences,
        checks.fence_comes_before_every_write,
        "a kind that writes nothing outside calls no begin_write()",
    ),
    (
        loopback.IgnoresARefusedFence,
        checks.nothing_is_written_when_the_fence_refuses,
        "when begin_write() refuses, the adapter returns Abandoned()",
    ),
    (
        loopback.FailsOnAnExceptionAtTheFence,
        checks.an_exception_before_the_fence_is_a_retry,
        "an exception before the fence is a retry",
    ),
    (
        loopback.RetriesALostAnswer,
        checks.an_exception_after_the_fence_is_a_reread_or_uncertain,
        "after the fence, a lost answer of a read-back kind is a Reread",
    ),
    (
        loopback.OnceRetriesALostAnswer,
        checks.an_exception_after_the_fence_is_a_reread_or_uncertain,
        "after the fence, a lost answer of an at-most-once kind is UNCERTAIN",
    ),
    (
        loopback.NeverReadsBack,
        checks.an_attempt_after_a_started_write_reads_back_first,
        "reads back first and never writes twice",
    ),
    (
        loopback.WritesAgainDespiteDeclaring,
        checks.an_attempt_after_a_started_write_reads_back_first,
        "an attempt that starts with write_started only reads",
    ),
    (
        loopback.FencesBeforeReadingBack,
        checks.a_read_back_outage_spends_no_attempt,
        "a read-back outage does not end the action before the kind's unreadable_for",
    ),
    (
        loopback.RereadsWithoutADetail,
        checks.rereads_defers_and_failures_carry_a_detail,
        "every Reread, Defer and Failed carries a detail",
    ),
    (
        loopback.UndeclaredStopReason,
        checks.variants_and_stop_reasons_are_declared,
        "the adapter's stop reasons are declared",
    ),
    (
        loopback.AcceptsAnyPayload,
        checks.variants_and_stop_reasons_are_declared,
        "enqueue refuses a payload outside variants()",
    ),
    (
        loopback.EndedCallsTheProvider,
        checks.ended_runs_for_every_ending_and_calls_no_provider,
        "ended() calls no provider",
    ),
    (
        loopback.EndedKnowsOnlyTheExecutorsEndings,
        checks.ended_handles_a_resolution,
        "ended() handles an operator's resolution",
    ),
    (
        loopback.CallsInsideTheTransaction,
        checks.no_provider_request_inside_the_attempt_transaction,
        "no provider request while attempt.transaction() is open",
    ),
    (
        loopback.DeclaresNoTimeout,
        checks.no_provider_request_inside_the_attempt_transaction,
        "the adapter declares its provider timeout",
    ),
    (
        loopback.TimesOutAfterTheMargin,
        checks.no_provider_request_inside_the_attempt_transaction,
        "the provider timeout is below the fence margin",
    ),
    (
        loopback.LogsThePayload,
        checks.no_payload_value_in_log_records,
        "no payload value appears in a log record",
    ),
    (
        loopback.DetailsThePayload,
        checks.no_payload_value_in_log_records,
        "no payload value appears in a result's detail",
    ),
]


@pytest.mark.parametrize(
    ("adapter", "check", "rule"), BROKEN, ids=[adapter.__name__ for adapter, _, _ in BROKEN]
)
def test_each_check_fails_on_an_adapter_that_breaks_its_rule(
    outbox_db: OutboxTestDatabase,
    server: LoopbackServer,
    adapter: type[LoopbackAdapter],
    check: Check,
    rule: str,
) -> None:
    # The payload that AcceptsAnyPayload takes and the sound declaration refuses.
    target = target_for(outbox_db, adapter, server, invalid_payloads=({"text": 5},))
    with pytest.raises(ConformanceFailure, match=re.escape(rule)):
        check(target)


def test_the_stall_check_fails_on_an_adapter_that_does_not_end_its_own_call(
    outbox_db: OutboxTestDatabase, server: LoopbackServer
) -> None:
    # A short lease, so that the executor's watchdog cuts the stalled call within seconds.
    target = target_for(outbox_db, loopback.IgnoresItsTimeout, server)
    outbox_db.configure(lease_seconds=8.0, fence_margin_seconds=3.0)
    rule = "the adapter's own timeout ends a provider call that gets no answer"
    with pytest.raises(ConformanceFailure, match=re.escape(rule)):
        checks.an_exception_after_the_fence_is_a_reread_or_uncertain(target)


def test_every_check_is_a_test_of_the_class() -> None:
    tests = {name for name in vars(AdapterConformance) if name.startswith("test_")}
    assert tests == {f"test_{check.__name__}" for check in checks.CHECKS}


def test_a_kind_that_writes_nothing_outside_is_never_at_most_once() -> None:
    class Contradiction(loopback.LoopbackDraftAdapter):
        at_most_once = True

    with pytest.raises(RegistrationError, match="writes nothing outside"):
        KindRegistry().register(Contradiction)
