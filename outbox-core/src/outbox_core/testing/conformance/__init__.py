"""The adapter conformance suite: the contract of ``ActionAdapter``, checked through the real
executor against the adapter's loopback provider on a real PostgreSQL.

A plugin subclasses :class:`AdapterConformance` in its tests (the class is not collected by
itself: its name does not start with ``Test``) and gives it one fixture, the
:class:`ConformanceTarget`: the test database with the kind registered, the loopback provider
(:class:`LoopbackProvider`: count its requests, count the writes it holds for an action, fail
its next write), and a factory of valid requests that carry a canary string::

    from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget

    class TestWebhookConformance(AdapterConformance):
        @pytest.fixture
        def conformance_target(self, outbox_db, receiver):
            return ConformanceTarget(
                db=outbox_db,
                kind="WEBHOOK_POST",
                provider=receiver,
                request=lambda key, canary: ActionRequest(
                    "WEBHOOK_POST", "hooks", key, payload={"url": receiver.url, "event": canary}
                ),
            )

The kind's declarations choose how it is checked (:class:`Profile`): ``at_most_once`` (never
sent twice: UNCERTAIN when in doubt), read-back (the default: an attempt after a started write
finds it), or ``writes_outside = False`` (a model call: no fence, a repeated call harmless).
Each test of the class is one function of :mod:`.checks`, which the core's own tests also call
on deliberately broken adapters to show that each check can fail.
"""

from __future__ import annotations

import pytest

from . import checks
from .probe import FenceBroken
from .run import Run
from .target import ConformanceFailure, ConformanceTarget, Fault, LoopbackProvider, Profile

__all__ = [
    "AdapterConformance",
    "ConformanceFailure",
    "ConformanceTarget",
    "Fault",
    "FenceBroken",
    "LoopbackProvider",
    "Profile",
    "Run",
    "checks",
]


class AdapterConformance:
    """Subclass it as ``Test<Something>`` and provide the fixture ``conformance_target``.

    Each test is one rule of the adapter contract (see :mod:`outbox_core.testing.conformance.
    checks`); a failure is a :class:`ConformanceFailure` that names the rule. The tests are
    plain functions (no event loop of pytest's): the loopback provider must serve from a thread
    of its own.
    """

    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        raise NotImplementedError(
            f"{type(self).__qualname__}: provide the fixture conformance_target, returning a "
            "ConformanceTarget(db=..., kind=..., provider=..., request=...)"
        )

    def test_fence_comes_before_every_write(self, conformance_target: ConformanceTarget) -> None:
        checks.fence_comes_before_every_write(conformance_target)

    def test_nothing_is_written_when_the_fence_refuses(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.nothing_is_written_when_the_fence_refuses(conformance_target)

    def test_an_exception_before_the_fence_is_a_retry(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.an_exception_before_the_fence_is_a_retry(conformance_target)

    def test_an_exception_after_the_fence_is_a_reread_or_uncertain(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.an_exception_after_the_fence_is_a_reread_or_uncertain(conformance_target)

    def test_an_attempt_after_a_started_write_reads_back_first(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.an_attempt_after_a_started_write_reads_back_first(conformance_target)

    def test_a_read_back_outage_spends_no_attempt(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.a_read_back_outage_spends_no_attempt(conformance_target)

    def test_rereads_defers_and_failures_carry_a_detail(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.rereads_defers_and_failures_carry_a_detail(conformance_target)

    def test_variants_and_stop_reasons_are_declared(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.variants_and_stop_reasons_are_declared(conformance_target)

    def test_ended_runs_for_every_ending_and_calls_no_provider(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.ended_runs_for_every_ending_and_calls_no_provider(conformance_target)

    def test_ended_handles_a_resolution(self, conformance_target: ConformanceTarget) -> None:
        checks.ended_handles_a_resolution(conformance_target)

    def test_no_provider_request_inside_the_attempt_transaction(
        self, conformance_target: ConformanceTarget
    ) -> None:
        checks.no_provider_request_inside_the_attempt_transaction(conformance_target)

    def test_no_payload_value_in_log_records(self, conformance_target: ConformanceTarget) -> None:
        checks.no_payload_value_in_log_records(conformance_target)
