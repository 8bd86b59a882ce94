"""The shared mapping of an HTTP provider's failed call to a result (``outbox_core.http_results``),
row by row, and the rate-limit reset that ``http_headers.reset_wait`` reads."""

from __future__ import annotations

import email.utils
import time
from datetime import timedelta

import pytest

from outbox_core import Defer, Failed, Reread, Retry, StopReason
from outbox_core.http_headers import reset_wait
from outbox_core.http_results import HttpFailure, Proof, http_result

WAIT = timedelta(seconds=30)


@pytest.mark.parametrize(
    ("status", "proof"),
    [
        (429, Proof.LIMITED),
        (500, Proof.UNANSWERED),
        (503, Proof.UNANSWERED),
        (200, Proof.UNANSWERED),
        (301, Proof.REFUSED),
        (400, Proof.REFUSED),
        (403, Proof.REFUSED),
        (404, Proof.REFUSED),
        (422, Proof.REFUSED),
    ],
)
def test_an_answers_status_alone_proves_a_limit_no_answer_or_a_refusal(
    status: int, proof: Proof
) -> None:
    assert HttpFailure.of_answer(status, f"HTTP {status}").proof is proof


@pytest.mark.parametrize(
    ("proof", "may_have_written", "expected"),
    [
        (Proof.NOT_SENT, False, Retry(after=WAIT, detail="d")),
        (Proof.NOT_SENT, True, Reread(detail="d")),
        (Proof.UNANSWERED, False, Retry(after=WAIT, detail="d")),
        (Proof.UNANSWERED, True, Reread(detail="d")),
        (Proof.LIMITED, False, Defer(WAIT, detail="d, waiting 30 s")),
        (Proof.LIMITED, True, Defer(WAIT, detail="d, waiting 30 s")),
        (Proof.REFUSED, False, Failed(StopReason.REFUSED, detail="d")),
        (Proof.REFUSED, True, Failed(StopReason.REFUSED, detail="d")),
    ],
)
def test_each_proof_becomes_its_result_whether_or_not_the_call_may_have_written(
    proof: Proof, may_have_written: bool, expected: object
) -> None:
    failure = HttpFailure(proof, "d", status=418, wait=WAIT)
    assert http_result(failure, may_have_written=may_have_written) == expected


def test_a_refusal_takes_the_kinds_reason_for_its_status() -> None:
    failure = HttpFailure.of_answer(404, "HTTP 404 Not Found")
    result = http_result(failure, refused_reason=lambda status: f"GITHUB_{status}")
    assert result == Failed("GITHUB_404", detail="HTTP 404 Not Found")


def test_a_refusal_without_a_status_is_refused_whatever_the_kinds_reasons() -> None:
    failure = HttpFailure(Proof.REFUSED, "GraphQL FORBIDDEN")
    result = http_result(failure, refused_reason=lambda status: f"GITHUB_{status}")
    assert result == Failed(StopReason.REFUSED, detail="GraphQL FORBIDDEN")


def test_a_limit_without_a_named_wait_waits_the_kinds_default() -> None:
    failure = HttpFailure.of_answer(429, "HTTP 429")
    result = http_result(failure, default_wait=timedelta(seconds=15))
    assert result == Defer(timedelta(seconds=15), detail="HTTP 429, waiting 15 s")


def test_a_retry_without_a_named_wait_leaves_the_wait_to_the_core() -> None:
    assert http_result(HttpFailure.of_answer(503, "HTTP 503")) == Retry(detail="HTTP 503")


def _http_date(unix: float) -> str:
    return email.utils.formatdate(unix, usegmt=True)


def test_reset_wait_reads_x_ratelimit_reset_against_the_answers_date() -> None:
    # The provider's clock is an hour behind this host's: the reset is 90 s after its Date.
    provider_now = time.time() - 3600
    headers = {"x-ratelimit-reset": str(int(provider_now) + 90), "date": _http_date(provider_now)}
    assert reset_wait(headers) == timedelta(seconds=90)


def test_reset_wait_reads_ratelimit_reset_as_seconds_from_now() -> None:
    assert reset_wait({"ratelimit-reset": "42"}) == timedelta(seconds=42)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-ratelimit-reset": "soon"},
        {"x-ratelimit-reset": "inf"},
        {"x-ratelimit-reset": "1e300"},
    ],
)
def test_reset_wait_is_none_without_a_readable_reset(headers: dict[str, str]) -> None:
    assert reset_wait(headers) is None


def test_a_reset_in_the_past_is_no_wait() -> None:
    assert reset_wait({"x-ratelimit-reset": "1000"}) == timedelta(0)
