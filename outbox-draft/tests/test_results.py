"""Every row of the adapter's results table, against the loopback model server: the final
state, the stop reason, the attempts counted, the filing's state and answer, and the requests
that reached the server. The draft runs alone here (no FILE_ISSUE behind it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_draft.adapter import CONTEXT_LENGTH_EXCEEDED
from outbox_draft.testing import CANNED, ModelTestServer
from outbox_issues import FilingState

from .conftest import action, drain_until_ended, enqueue_draft, filing, kept, store_report

DONE, FAILED = ActionState.DONE, ActionState.FAILED
COMPLETED, EXHAUSTED = StopReason.COMPLETED, StopReason.ATTEMPTS_EXHAUSTED
NOT_CONFIGURED, REFUSED = StopReason.NOT_CONFIGURED, StopReason.REFUSED


@dataclass(frozen=True)
class Row:
    name: str
    provoke: Callable[[ModelTestServer], None]
    state: ActionState
    stop_reason: str
    attempts: int
    answered: bool
    requests: int


def context_too_long(server: ModelTestServer) -> None:
    server.fail(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 9001 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


UNSUPPORTED = {
    "error": {
        "message": "Unsupported value: 'temperature' does not support 0.2 with this model.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }
}

ROWS = [
    Row("answer", lambda s: None, DONE, COMPLETED, 1, True, 1),
    Row("5xx-always", lambda s: s.server_error(500, times=3), FAILED, EXHAUSTED, 3, False, 3),
    Row("502-then-answer", lambda s: s.server_error(502), DONE, COMPLETED, 2, True, 2),
    Row("503-overloaded", lambda s: s.server_error(503), DONE, COMPLETED, 2, True, 2),
    Row("stall-then-answer", lambda s: s.stall(), DONE, COMPLETED, 2, True, 2),
    Row("drop-then-answer", lambda s: s.drop(), DONE, COMPLETED, 2, True, 2),
    Row(
        "upstream-rate-limit-always",
        lambda s: s.upstream_rate_limit(times=3),
        FAILED,
        EXHAUSTED,
        3,
        False,
        3,
    ),
    Row(
        "openai-rate-limit-then-answer",
        lambda s: s.upstream_rate_limit(openai=True),
        DONE,
        COMPLETED,
        2,
        True,
        2,
    ),
    Row("capacity-twice", lambda s: s.capacity(times=2), DONE, COMPLETED, 1, True, 3),
    Row(
        "limiter-capacity",
        lambda s: s.capacity(wording="key_limits"),
        DONE,
        COMPLETED,
        1,
        True,
        2,
    ),
    Row(
        "parallel-slots-capacity",
        lambda s: s.capacity(wording="max_parallel_requests"),
        DONE,
        COMPLETED,
        1,
        True,
        2,
    ),
    Row(
        "ollama-queue-full", lambda s: s.capacity(wording="queue_full"), DONE, COMPLETED, 1, True, 2
    ),
    Row("404-model-not-found", lambda s: s.unknown_model(404), FAILED, NOT_CONFIGURED, 1, False, 1),
    Row("400-invalid-model", lambda s: s.unknown_model(400), FAILED, NOT_CONFIGURED, 1, False, 1),
    Row("401", lambda s: s.unauthorized(401), FAILED, NOT_CONFIGURED, 1, False, 1),
    Row("403", lambda s: s.unauthorized(403), FAILED, NOT_CONFIGURED, 1, False, 1),
    Row(
        "insufficient-quota", lambda s: s.insufficient_quota(), FAILED, NOT_CONFIGURED, 1, False, 1
    ),
    Row("400-context-length", context_too_long, FAILED, CONTEXT_LENGTH_EXCEEDED, 1, False, 1),
    Row(
        "litellm-context-window",
        lambda s: s.context_limit(64, wording="litellm"),
        FAILED,
        CONTEXT_LENGTH_EXCEEDED,
        1,
        False,
        1,
    ),
    Row(
        "vllm-context-length",
        lambda s: s.context_limit(64, wording="vllm"),
        FAILED,
        CONTEXT_LENGTH_EXCEEDED,
        1,
        False,
        1,
    ),
    Row(
        "400-unsupported-parameter",
        lambda s: s.fail(400, UNSUPPORTED),
        FAILED,
        REFUSED,
        1,
        False,
        1,
    ),
    Row("no-text-always", lambda s: s.answer("  ", times=3), FAILED, EXHAUSTED, 3, False, 3),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_answer_of_the_model_ends_the_draft_as_the_table_says(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer, row: Row
) -> None:
    store_report(draft_db)
    row.provoke(model_server)
    enqueue_draft(draft_db)

    drain_until_ended(draft_db, "draft:r1:1")

    assert action(draft_db, "draft:r1:1") == (row.state, row.stop_reason, row.attempts)
    found = filing(draft_db)
    assert found.state is FilingState.ANSWERED  # the ended hook, however it ended
    assert found.has_draft is row.answered
    assert len(model_server.completions()) == row.requests
    if row.answered:
        generation, title, body = kept(draft_db)
        assert generation == 1
        assert (title, body) == tuple(CANNED.split("\n\n"))


def test_without_a_model_in_the_settings_the_attempt_fails_not_configured_and_calls_nothing(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    store_report(draft_db)
    enqueue_draft(draft_db)
    from outbox_draft.testing import serve_draft

    serve_draft(draft_db, model_server, model=None)

    drain_until_ended(draft_db, "draft:r1:1")

    assert action(draft_db, "draft:r1:1") == (FAILED, NOT_CONFIGURED, 1)
    assert model_server.requests == []
    assert filing(draft_db).state is FilingState.ANSWERED
