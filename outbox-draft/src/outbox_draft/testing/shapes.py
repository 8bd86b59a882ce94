"""The error bodies of the servers that :class:`~outbox_draft.testing.server.ModelTestServer`
stands in for: OpenAI's, LiteLLM's (its proxy's ``ProxyException``), Ollama's and vLLM's, for
a capacity refusal, a context too long and the rest."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal


def openai_error(message: str, kind: str, code: str | None, param: str | None = None) -> Any:
    """OpenAI's error body (``error``: message, type, param, code)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def litellm_error(message: str, code: int, kind: str = "None", param: Any = "None") -> Any:
    """LiteLLM's ProxyException body: type and param the strings "None" (its older releases;
    newer ones name the type, ``throttling_error``, and send a null param), code a string."""
    return {"error": {"message": message, "type": kind, "param": param, "code": str(code)}}


def ollama_error(message: str) -> Any:
    """Ollama's ``/v1`` error body (``openai.NewError``): type ``api_error`` but for 400 and
    404, param and code null."""
    return {"error": {"message": message, "type": "api_error", "param": None, "code": None}}


CapacityName = Literal[
    "no_deployments",
    "no_healthy_deployment",
    "max_parallel_requests",
    "key_max_parallel",
    "key_tpm_rpm",
    "key_limits",
    "queue_full",
]
"""The wordings of :meth:`ModelTestServer.capacity`: the names of the capacity table's rows
(:data:`outbox_draft.capacity.CAPACITY`)."""


def capacity_body(name: CapacityName, model: str, wait: float = 1) -> tuple[int, Any]:
    """The status and body a real server sends with each capacity refusal (the proxy's own):
    LiteLLM's router, its deployment slots and its key limiter, Ollama's queue."""
    match name:
        case "no_deployments":
            message = (
                f"No deployments available for selected model, Try again in {wait:g} seconds. "
                f"Passed model={model}. pre-call-checks=False, cooldown_list=[]"
            )
            return 429, litellm_error(message, 429)
        case "no_healthy_deployment":
            return 429, litellm_error(f"No healthy deployment available, passed model={model}", 429)
        case "max_parallel_requests":
            message = (
                "litellm.RateLimitError: Deployment has all max_parallel_requests slots in use. "
                f"Deployment model_group={model}, id=3f1c9e0a already has "
                "max_parallel_requests=2 requests in flight. Raise max_parallel_requests (or "
                "the rpm/tpm it is derived from) for this deployment. Received Model "
                f"Group={model}\nAvailable Model Group Fallbacks=None"
            )
            return 429, litellm_error(message, 429, "throttling_error", None)
        case "key_max_parallel":
            return 429, litellm_error("Max parallel request limit reached.", 429)
        case "key_tpm_rpm":
            message = (
                "LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM, RPM Limit. "
                "current rpm: 1, rpm limit: 1, current tpm: 0, tpm limit: 9223372036854775807"
            )
            return 429, litellm_error(message, 429)
        case "key_limits":
            message = (
                "LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM / RPM / Max "
                "Parallel Request Limit. current rpm: 1, rpm limit: 1, current tpm: 348, tpm "
                "limit: 9223372036854775807, current max_parallel_requests: 1, "
                "max_parallel_requests: 1"
            )
            return 429, litellm_error(message, 429)
        case "queue_full":
            return 503, ollama_error(
                "server busy, please try again.  maximum pending requests exceeded"
            )


ContextWording = Literal["openai", "litellm", "vllm"]


def context_body(wording: ContextWording, model: str, limit: int, prompt: int, answer: int) -> Any:
    """The 400 a server sends for a request longer than the model's context: OpenAI's
    ``context_length_exceeded``, LiteLLM's ``ContextWindowExceededError`` (its message names the
    model group), vLLM's ``BadRequestError``."""
    match wording:
        case "openai":
            return openai_error(
                f"This model's maximum context length is {limit} tokens. However, your messages "
                f"resulted in {prompt} tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
                "messages",
            )
        case "litellm":
            message = (
                "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                "ContextWindowExceededError: OpenAIException - This model's maximum context "
                f"length is {limit} tokens. However, your request has {prompt} input tokens. "
                f"Please reduce the length of the input messages. Received Model Group={model}"
                "\nAvailable Model Group Fallbacks=None"
            )
            return litellm_error(message, 400, "None", "None")
        case "vllm":
            return {
                "object": "error",
                "message": f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt + answer} tokens ({prompt} in the messages, {answer} in the "
                "completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }


MAX_TOKENS_REFUSED = openai_error(
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
    "'max_completion_tokens' instead.",
    "invalid_request_error",
    "unsupported_parameter",
    "max_tokens",
)
"""OpenAI's 400 for ``max_tokens`` sent to its newer models."""


def unknown_model_body(status: int, model: str) -> tuple[int, Any]:
    """OpenAI's 404 ``model_not_found``, or LiteLLM's 400 "Invalid model name" (``status``)."""
    if status == 400:
        message = (
            f"400: {{'error': '/chat/completions: Invalid model name passed in model={model}."
            " Call `/v1/models` to view available models for your key.'}"
        )
        return 400, litellm_error(message, 400)
    return 404, openai_error(
        f"The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    )


def completion_body(
    text: str, tool_calls: list[dict[str, Any]] | None, request: dict[str, Any], model: str
) -> dict[str, Any]:
    """A chat completion answering ``request`` with ``text`` (and ``tool_calls``), with usage
    counted in words; ``model`` when the request names none."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    prompt = sum(
        len(str(m.get("content", "")).split())
        for m in request.get("messages", [])
        if isinstance(m, dict)
    )
    completion = len(text.split())
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", model),
        "system_fingerprint": "fp_loopback",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
