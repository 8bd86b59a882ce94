"""What a draft keeps on its action (``last_detail``) when it waits or stops: a Defer and a
NOT_CONFIGURED say the provider's code and a short reason, never the report's text (issue 31,
item 5's part for the draft)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_draft.testing import ModelTestServer, serve_draft

from .conftest import drain_until_ended, enqueue_draft, store_report

CANARY = "canary-7f3a9c"
TEXT = f"The export does nothing ({CANARY}) when the list is empty."


def quoting(status: int, code: str) -> Callable[[ModelTestServer], None]:
    """A refusal whose message quotes what was sent, as some servers' validation errors do."""

    def provoke(server: ModelTestServer) -> None:
        message = f"The model does not exist; your messages were: {TEXT}"
        body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
        server.fail(status, body)

    return provoke


def full_limit(db: OutboxTestDatabase, server: ModelTestServer) -> None:
    serve_draft(db, server, max_in_flight_total=1)
    db.execute(
        "INSERT INTO {schema}.draft_slot (slot, action_id, epoch, held_until) "
        "VALUES (1, -1, 1, now() + interval '1 hour')"
    )


@dataclass(frozen=True)
class Case:
    name: str
    provoke: Callable[[OutboxTestDatabase, ModelTestServer], None]
    state: ActionState
    stop_reason: str | None
    detail: str


CASES = [
    Case(
        "litellm-parallel-slots",
        lambda db, s: s.capacity(wording="max_parallel_requests"),
        ActionState.ADMITTED,
        None,
        "LiteLLM 429 max_parallel_requests (the proxy's capacity); again in 1 s",
    ),
    Case(
        "router-cooldown-with-retry-after",
        lambda db, s: s.capacity(retry_after=30),
        ActionState.ADMITTED,
        None,
        "LiteLLM 429 no_deployments (the proxy's capacity); again in 30 s",
    ),
    Case(
        "ollama-queue-full",
        lambda db, s: s.capacity(wording="queue_full"),
        ActionState.ADMITTED,
        None,
        "Ollama 503 queue_full (the proxy's capacity); again in 1 s",
    ),
    Case(
        "cross-replica-limit-full",
        full_limit,
        ActionState.ADMITTED,
        None,
        "limit full: OUTBOX_DRAFT_MAX_IN_FLIGHT_TOTAL=1 calls in flight; again in 1 s",
    ),
    Case(
        "no-model-in-the-settings",
        lambda db, s: serve_draft(db, s, model=None),
        ActionState.FAILED,
        StopReason.NOT_CONFIGURED,
        "not configured: OUTBOX_DRAFT_MODEL unset",
    ),
    Case(
        "model-not-found-quoting-the-report",
        lambda db, s: quoting(404, "model_not_found")(s),
        ActionState.FAILED,
        StopReason.NOT_CONFIGURED,
        "HTTP 404 model_not_found: the proxy serves no such model or endpoint",
    ),
    Case(
        "key-refused",
        lambda db, s: s.unauthorized(401),
        ActionState.FAILED,
        StopReason.NOT_CONFIGURED,
        "HTTP 401 invalid_api_key: the key is refused",
    ),
    Case(
        "quota",
        lambda db, s: s.insufficient_quota(),
        ActionState.FAILED,
        StopReason.NOT_CONFIGURED,
        "HTTP 429 insufficient_quota: no quota or budget left",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_deferral_and_a_not_configured_keep_the_providers_code_and_a_reason_never_the_text(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer, case: Case
) -> None:
    store_report(draft_db, text=TEXT)
    enqueue_draft(draft_db)
    case.provoke(draft_db, model_server)  # after the enqueue: without a model no draft is made

    draft_db.drain()  # one attempt: a deferral waits, a refusal ends

    [(state, stop_reason, attempts, detail)] = draft_db.rows(
        "SELECT state, stop_reason, attempt, last_detail FROM {schema}.agent_action "
        "WHERE idempotency_key = 'draft:r1:1'"
    )
    assert (ActionState(state), stop_reason) == (case.state, case.stop_reason)
    assert attempts == (0 if case.state is ActionState.ADMITTED else 1)  # a Defer spends none
    assert detail == case.detail
    assert CANARY not in detail


def test_a_providers_message_that_quotes_the_report_is_kept_out_of_the_log(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    store_report(draft_db, text=TEXT)
    enqueue_draft(draft_db)
    quoting(404, "model_not_found")(model_server)

    with caplog.at_level(logging.INFO, logger="outbox"):
        drain_until_ended(draft_db, "draft:r1:1")

    [record] = [r for r in caplog.records if r.getMessage().startswith("draft.model.")]
    assert CANARY not in caplog.text
    assert "it quotes the request" in record.getMessage()
    assert "model_not_found: the proxy serves no such model" in record.getMessage()
