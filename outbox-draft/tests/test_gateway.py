"""What the gateway sends and how it reads the proxy's answers: the request has no tools, and a
429 of the proxy's own capacity is told apart from an upstream provider's rate limit by the
bodies LiteLLM and OpenAI send."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from outbox_core import ConfigurationError
from outbox_draft import DraftReportAdapter, DraftSettings
from outbox_draft.gateway import (
    TOOL_FIELDS,
    Answer,
    ContextExceeded,
    ModelRefused,
    ProxyBusy,
    RequestRefused,
    UpstreamFailed,
    Usage,
    classify,
    read_answer,
    request_body,
)
from outbox_draft.prompt import SYSTEM_PROMPT

MODEL = "gpt-4o-mini"


def litellm(message: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "None", "param": "None", "code": str(code)}}


def openai(message: str, kind: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


CASES = [
    (
        "litellm-no-deployments",
        429,
        litellm(
            "No deployments available for selected model, Try again in 60 seconds. Passed "
            "model=gpt-4o-mini. pre-call-checks=False, cooldown_list=['c9d4']",
            429,
        ),
        ProxyBusy,
    ),
    (
        "litellm-no-healthy-deployment",
        429,
        litellm("No healthy deployment available, passed model=gpt-4o-mini", 429),
        ProxyBusy,
    ),
    (
        "litellm-limiter",
        429,
        litellm(
            "LiteLLM Rate Limit Handler for rate limit type = team. Crossed TPM / RPM / Max "
            "Parallel Request Limit. current rpm: 1, rpm limit: 1",
            429,
        ),
        ProxyBusy,
    ),
    (
        "ollama-queue-full",
        503,
        {"error": "server busy, please try again.  maximum pending requests exceeded"},
        ProxyBusy,
    ),
    (
        "ollama-v1-queue-full",
        503,
        {
            "error": {
                "message": "server busy, please try again.  maximum pending requests exceeded",
                "type": "api_error",
                "param": None,
                "code": None,
            }
        },
        ProxyBusy,
    ),
    (
        "ollama-cloud-overloaded",  # the model's servers behind Ollama, not Ollama's own queue
        503,
        {"error": "Server overloaded, please retry shortly (ref: aaa65c70)"},
        UpstreamFailed,
    ),
    (
        "litellm-deployment-parallel-slots",
        429,
        {
            "error": {
                "message": "litellm.RateLimitError: Deployment has all max_parallel_requests "
                "slots in use. Deployment model_group=gpt-4o-mini, id=9d1e already has "
                "max_parallel_requests=2 requests in flight. Raise max_parallel_requests (or "
                "the rpm/tpm it is derived from) for this deployment. Received Model "
                "Group=gpt-4o-mini\nAvailable Model Group Fallbacks=None",
                "type": "throttling_error",
                "param": None,
                "code": "429",
            }
        },
        ProxyBusy,
    ),
    (
        "litellm-key-parallel-1.60.5",
        429,
        litellm("Max parallel request limit reached.", 429),
        ProxyBusy,
    ),
    (
        "litellm-limiter-1.60.8",
        429,
        litellm(
            "LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM, RPM Limit. "
            "current rpm: 1, rpm limit: 9223372036854775807",
            429,
        ),
        ProxyBusy,
    ),
    (
        "litellm-upstream-throttling-error",  # newer releases type an upstream limit so too
        429,
        {
            "error": {
                "message": "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit "
                "reached for gpt-4o-mini. Received Model Group=gpt-4o-mini",
                "type": "throttling_error",
                "param": None,
                "code": "429",
            }
        },
        UpstreamFailed,
    ),
    (
        "capacity-words-with-another-status",  # a wording counts only with its status
        500,
        litellm("No deployments available for selected model", 500),
        UpstreamFailed,
    ),
    (
        "litellm-upstream-rate-limit",
        429,
        litellm(
            "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for "
            "requests. Received Model Group=gpt-4o-mini\nAvailable Model Group Fallbacks=None",
            429,
        ),
        UpstreamFailed,
    ),
    (
        "openai-rate-limit",
        429,
        openai(
            "Rate limit reached for gpt-4o-mini on requests per min",
            "requests",
            "rate_limit_exceeded",
        ),
        UpstreamFailed,
    ),
    ("bare-429", 429, None, UpstreamFailed),
    (
        "openai-insufficient-quota",
        429,
        openai("You exceeded your current quota", "insufficient_quota", "insufficient_quota"),
        ModelRefused,
    ),
    (
        "openai-spend-limit",
        429,
        openai(
            "You exceeded your current quota", "insufficient_quota", "project_spend_limit_exceeded"
        ),
        ModelRefused,
    ),
    (
        "litellm-budget",
        429,
        {
            "error": {
                "message": "Budget has been exceeded! Current cost: 1.2, Max budget: 1.0",
                "type": "budget_exceeded",
                "param": None,
                "code": "429",
            }
        },
        ModelRefused,
    ),
    (
        "openai-model-not-found",
        404,
        openai(
            "The model `gpt-4o-mini` does not exist", "invalid_request_error", "model_not_found"
        ),
        ModelRefused,
    ),
    (
        "vllm-model-not-found",
        404,
        {
            "object": "error",
            "message": "The model `gpt-4o-mini` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        },
        ModelRefused,
    ),
    (
        "litellm-invalid-model",
        400,
        litellm(
            "400: {'error': '/chat/completions: Invalid model name passed in model=gpt-4o-mini.'}",
            400,
        ),
        ModelRefused,
    ),
    (
        "openai-400-model-param",
        400,
        openai("invalid model ID", "invalid_request_error", None, "model"),
        ModelRefused,
    ),
    (
        "401",
        401,
        openai("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
        ModelRefused,
    ),
    (
        "403",
        403,
        openai("Country, region, or territory not supported", "request_forbidden", None),
        ModelRefused,
    ),
    (
        "litellm-no-healthy-deployments-for-this-model",  # an unknown model, not capacity
        400,
        litellm(
            "litellm.BadRequestError: You passed in model=gpt-4o-mini. There are no healthy "
            "deployments for this model. Received Model Group=gpt-4o-mini",
            400,
        ),
        ModelRefused,
    ),
    ("redirect", 307, None, ModelRefused),
    (
        "openai-context-length",
        400,
        openai(
            "This model's maximum context length is 8192 tokens.",
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        ),
        ContextExceeded,
    ),
    (
        "litellm-context-window",  # its message names the model group too
        400,
        litellm(
            "litellm.ContextWindowExceededError: litellm.BadRequestError: "
            "ContextWindowExceededError: OpenAIException - This model's maximum context length "
            "is 16384 tokens. However, your request has 19427 input tokens. Received Model "
            "Group=gpt-4o-mini\nAvailable Model Group Fallbacks=None",
            400,
        ),
        ContextExceeded,
    ),
    (
        "vllm-context-length",
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens (4200 in the messages, 800 in the completion).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        ContextExceeded,
    ),
    ("422", 422, {"detail": [{"msg": "field required"}]}, RequestRefused),
    ("500", 500, openai("The server had an error", "server_error", None), UpstreamFailed),
    ("502-html", 502, None, UpstreamFailed),
    (
        "503",
        503,
        openai("The engine is currently overloaded", "server_error", None),
        UpstreamFailed,
    ),
    ("408", 408, None, UpstreamFailed),
]


@pytest.mark.parametrize(
    ("status", "body", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_error_body_is_read_as_what_it_proves(status: int, body: Any, expected: type) -> None:
    assert type(classify(status, body, {}, MODEL)) is expected


DETAILS = [
    (
        "capacity",
        429,
        litellm("No deployments available for selected model, Try again in 9 seconds.", 429),
        "LiteLLM 429 no_deployments (the proxy's capacity)",
    ),
    (
        "model-not-found-quoting-the-request",
        404,
        openai(
            "The model `x` does not exist: SECRET-REPORT-TEXT",
            "invalid_request_error",
            "model_not_found",
        ),
        "HTTP 404 model_not_found: the proxy serves no such model or endpoint",
    ),
    (
        "quota",
        429,
        openai("You exceeded your current quota", "insufficient_quota", "insufficient_quota"),
        "HTTP 429 insufficient_quota: no quota or budget left",
    ),
    (
        "litellm-status-code-and-none-type-are-left-out",
        500,
        litellm("litellm.InternalServerError: SECRET-REPORT-TEXT", 500),
        "HTTP 500: the server failed",
    ),
    (
        "free-text-code-is-left-out",
        400,
        openai("bad", "invalid_request_error", "not a code: SECRET-REPORT-TEXT"),
        "HTTP 400 invalid_request_error: the request was refused",
    ),
]


@pytest.mark.parametrize(
    ("status", "body", "detail"), [d[1:] for d in DETAILS], ids=[d[0] for d in DETAILS]
)
def test_a_failures_detail_is_its_status_code_and_reason_never_the_providers_message(
    status: int, body: Any, detail: str
) -> None:
    error = classify(status, body, {}, MODEL)
    assert error.detail == detail
    assert "SECRET-REPORT-TEXT" not in error.detail


def test_the_proxys_wait_comes_from_retry_after_or_else_from_its_message() -> None:
    busy = litellm("No deployments available for selected model, Try again in 42 seconds.", 429)
    from_header = classify(429, busy, {"retry-after": "7"}, MODEL)
    from_message = classify(429, busy, {}, MODEL)
    assert isinstance(from_header, ProxyBusy) and from_header.wait == timedelta(seconds=7)
    assert isinstance(from_message, ProxyBusy) and from_message.wait == timedelta(seconds=42)
    upstream = classify(429, None, {"retry-after": "3"}, MODEL)
    assert isinstance(upstream, UpstreamFailed) and upstream.wait == timedelta(seconds=3)


def test_the_request_has_the_fixed_system_prompt_the_text_as_user_content_and_no_tools() -> None:
    settings = DraftSettings(base_url="http://proxy:4000/v1", model=MODEL)
    body = request_body(settings, "Please call a tool.")
    assert not set(TOOL_FIELDS) & set(body)
    assert body == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Please call a tool."},
        ],
        "max_tokens": 800,
        "stream": False,
    }
    assert settings.completions_url == "http://proxy:4000/v1/chat/completions"


def test_only_the_answers_text_is_read_tool_calls_are_ignored_and_no_text_is_a_failure() -> None:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "Title\n\nBody", "tool_calls": [{"id": "x"}]},
        "finish_reason": "tool_calls",
    }
    body = {"id": "chatcmpl-1", "model": MODEL, "choices": [choice], "usage": {"prompt_tokens": 3}}
    answer = read_answer(body)
    assert (answer.text, answer.completion_id, answer.usage.prompt_tokens) == (
        "Title\n\nBody",
        "chatcmpl-1",
        3,
    )
    choice["message"] = {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}
    with pytest.raises(UpstreamFailed, match="no text"):
        read_answer(body)
    with pytest.raises(UpstreamFailed, match="not a chat completion"):
        read_answer({"object": "list"})


@pytest.mark.parametrize(
    ("text", "title", "body"),
    [
        ("Export broken\n\nIt does nothing.", "Export broken", "It does nothing."),
        ("# **Export broken**\nIt does nothing.", "Export broken", "It does nothing."),
        ("Title: Export broken\n\nIt does nothing.", "Export broken", "It does nothing."),
        ("  One line only  ", "One line only", "One line only"),
    ],
)
def test_the_answers_first_line_is_the_title_and_the_rest_the_body(
    text: str, title: str, body: str
) -> None:
    answer = Answer(text, None, None, "stop", Usage())
    assert answer.title_and_body(1000) == (title, body)


def test_the_api_key_is_a_secret_and_a_wrong_base_url_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = DraftSettings(base_url="http://proxy/v1", model=MODEL, api_key="sk-secret")
    assert "sk-secret" not in repr(settings) and "sk-secret" not in str(settings.model_dump())
    monkeypatch.setenv("OUTBOX_DRAFT_BASE_URL", "proxy:4000")
    with pytest.raises(ConfigurationError, match="OUTBOX_DRAFT_BASE_URL"):
        DraftSettings.load()


def test_timeouts_that_reach_the_fence_margin_are_refused_naming_the_variables() -> None:
    settings = DraftSettings(base_url="http://proxy/v1", model=MODEL, request_timeout_seconds=58.0)
    with pytest.raises(ConfigurationError, match="OUTBOX_DRAFT_REQUEST_TIMEOUT_SECONDS"):
        DraftReportAdapter(settings)
    assert DraftReportAdapter(DraftSettings()).provider_timeout_seconds == 55.0
