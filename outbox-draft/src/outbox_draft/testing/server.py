"""``ModelTestServer``: an OpenAI-compatible chat-completions server on loopback.

It answers ``POST /v1/chat/completions`` with the shape OpenAI documents (``id``, ``object:
"chat.completion"``, ``created``, ``model``, ``choices[].message`` with ``role``, ``content`` and
``refusal``, ``finish_reason``, ``usage`` with ``prompt_tokens``, ``completion_tokens`` and
``total_tokens``), checks the bearer key and the model as OpenAI does, and records every request
it receives (:attr:`ModelTestServer.requests`), answered or not.

Told what to do with the next ``times`` completions, it answers with the error bodies the real
servers send:

- :meth:`~ModelTestServer.answer`: a canned text (optionally with ``tool_calls`` beside it);
- :meth:`~ModelTestServer.capacity`: a capacity refusal of the proxy itself, in each wording of
  the capacity table (:data:`outbox_draft.capacity.CAPACITY`) with the real server's body:
  LiteLLM's 429 when no deployment is free ("No deployments available for selected model, Try
  again in N seconds", the default), its limiters' ("Crossed TPM / RPM / Max Parallel Request
  Limit", ...), Ollama's 503 "server busy";
- :meth:`~ModelTestServer.parallel_limit`: LiteLLM's ``max_parallel_requests`` of a deployment:
  a completion that arrives while that many are being answered gets LiteLLM's 429
  ``throttling_error`` "Deployment has all max_parallel_requests slots in use" at once;
- :meth:`~ModelTestServer.context_limit`: a model's context: a request whose messages and
  ``max_tokens`` exceed it gets the 400 of OpenAI (``context_length_exceeded``), of LiteLLM
  (``ContextWindowExceededError``) or of vLLM;
- :meth:`~ModelTestServer.upstream_rate_limit`: the 429 of a provider's rate limit, as LiteLLM
  passes it on (``litellm.RateLimitError: ...``) or as OpenAI sends it (``openai=True``,
  ``code: rate_limit_exceeded``);
- :meth:`~ModelTestServer.insufficient_quota`: OpenAI's 429 ``insufficient_quota``;
- :meth:`~ModelTestServer.server_error`: a 5xx;
- :meth:`~ModelTestServer.unknown_model`: OpenAI's 404 ``model_not_found``, or LiteLLM's 400
  "Invalid model name passed in model=..." (``status=400``);
- :meth:`~ModelTestServer.stall`: no answer until the client gives up;
- :meth:`~ModelTestServer.drop`: the connection closed without an answer;
- :meth:`~ModelTestServer.hold_answers`: completions wait until
  :meth:`~ModelTestServer.release_answers` (to have calls in flight at once, with
  :meth:`~ModelTestServer.wait_until`).

Its start and stop, recording and stalls are the core's loopback base
(:class:`outbox_core.testing.loopback_http.LoopbackHTTPServer`); the error bodies are in
:mod:`outbox_draft.testing.shapes`. Only the standard library.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from outbox_core.testing.faults import FaultQueue
from outbox_core.testing.faults import retry_after as retry_after_header
from outbox_core.testing.loopback_http import Exchange, LoopbackHTTPServer, Received

from ..settings import DraftSettings
from .shapes import (
    MAX_TOKENS_REFUSED,
    CapacityName,
    ContextWording,
    capacity_body,
    completion_body,
    context_body,
    litellm_error,
    openai_error,
    unknown_model_body,
)

MODEL = "loopback-model"
API_KEY = "sk-loopback-test-key"
CANNED = (
    "Export does nothing on an empty list\n\n"
    "The export button has no effect when the list is empty."
)
Mode = Literal["answer", "status", "unknown_model", "stall", "drop"]


@dataclass
class Behaviour:
    """What the server does with one completion request."""

    mode: Mode
    times: int = 1
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    text: str = CANNED
    tool_calls: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def user_text(self) -> str:
        """The user messages' content of a chat completion request."""
        if not isinstance(self.body, dict):
            return ""
        messages = self.body.get("messages") or []
        return "\n".join(
            str(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") == "user"
        )


COMPLETION = "completion"  # the operation the behaviours are queued for


class ModelTestServer(LoopbackHTTPServer):
    """Start with ``with ModelTestServer() as server:`` (or :meth:`start`/:meth:`stop`)."""

    thread_name = "model-test-server"
    server_version = "loopback-openai"

    def __init__(
        self,
        *,
        models: tuple[str, ...] = (MODEL,),
        api_key: str | None = API_KEY,
        stall_seconds: float = 30.0,
        refuse_max_tokens: bool = False,
    ) -> None:
        super().__init__(stall_seconds=stall_seconds)
        self.models = list(models)
        self.api_key = api_key
        self.refuse_max_tokens = refuse_max_tokens
        """Answer ``max_tokens`` as OpenAI's newer models do (400: use max_completion_tokens)."""
        self.requests: list[Recorded] = []
        self.served: list[Recorded] = []
        """The completion requests answered with a completion."""
        self.default = Behaviour("answer")
        self.delay_seconds = 0.0
        """How long each answer takes (the model thinking), for tests of calls in flight."""
        self.in_flight = 0
        self.max_in_flight = 0
        """The most completions that were being answered at once."""
        self.max_parallel_requests: int | None = None
        """LiteLLM's deployment limit (:meth:`parallel_limit`); None: no limit."""
        self.parallel_refused = 0
        """The completions refused for the deployment's max_parallel_requests."""
        self.context_tokens: int | None = None
        self.context_wording: ContextWording = "openai"
        self._answers = self.gate(open=True)
        self._queue: FaultQueue[Behaviour] = FaultQueue()
        self._before_answer: list[Callable[[Recorded], None]] = []

    @property
    def base_url(self) -> str:
        """The base URL as the OpenAI client has it, up to and with ``/v1``."""
        return f"{self.origin}/v1"

    def settings(self, **overrides: Any) -> DraftSettings:
        """Settings that reach this server (short timeouts), with ``overrides``."""
        values: dict[str, Any] = {
            "base_url": self.base_url,
            "model": self.models[0] if self.models else MODEL,
            "api_key": self.api_key,
            "connect_timeout_seconds": 2.0,
            "request_timeout_seconds": 2.0,
            "capacity_wait_seconds": 1.0,
        }
        values.update(overrides)
        return DraftSettings(**values)

    # -- behaviours ----------------------------------------------------------------------------

    def _add(self, behaviour: Behaviour) -> None:
        self._queue.add(COMPLETION, behaviour, behaviour.times)

    def answer(
        self, text: str, *, times: int = 1, tool_calls: list[dict[str, Any]] | None = None
    ) -> None:
        """Answer the next ``times`` completions with ``text`` (and ``tool_calls`` beside it,
        as a model that ignored its missing tools might)."""
        self._add(Behaviour("answer", times, text=text, tool_calls=tool_calls))

    def always_answer(self, text: str) -> None:
        """Answer every completion without another behaviour queued with ``text``."""
        self.default = Behaviour("answer", text=text)

    def fail(
        self, status: int, body: Any, *, times: int = 1, headers: dict[str, str] | None = None
    ) -> None:
        """Answer the next ``times`` completions with this status, body and headers."""
        self._add(Behaviour("status", times, status=status, body=body, headers=headers or {}))

    def capacity(
        self,
        *,
        times: int = 1,
        retry_after: float | None = None,
        wording: CapacityName = "no_deployments",
    ) -> None:
        """The proxy's own capacity refusal, in ``wording`` (:func:`capacity_body`; LiteLLM's
        router's "No deployments available" by default), with ``Retry-After`` when given."""
        wait = retry_after if retry_after is not None else 1
        status, body = capacity_body(wording, self.models[0] if self.models else MODEL, wait)
        self.fail(status, body, times=times, headers=retry_after_header(retry_after))

    def parallel_limit(self, limit: int | None) -> None:
        """LiteLLM's ``max_parallel_requests`` of the model's one deployment: while ``limit``
        completions are being answered, another gets LiteLLM's 429 at once (nothing queues, as
        in its releases that refuse instead of queueing). None: no limit."""
        with self.lock:
            self.max_parallel_requests = limit

    def context_limit(self, tokens: int | None, *, wording: ContextWording = "openai") -> None:
        """The model's context: a request whose messages (counted at four characters a token)
        and ``max_tokens`` exceed ``tokens`` gets ``wording``'s 400 (:func:`context_body`).
        None: no limit."""
        with self.lock:
            self.context_tokens = tokens
            self.context_wording = wording

    def hold_answers(self) -> None:
        """Completions wait before they are answered, until :meth:`release_answers`."""
        self._answers.close()

    def release_answers(self) -> None:
        self._answers.open()

    def upstream_rate_limit(
        self, *, times: int = 1, openai: bool = False, retry_after: float | None = None
    ) -> None:
        """An upstream provider's rate limit: as LiteLLM passes it on, or as OpenAI sends it."""
        if openai:
            body = openai_error(
                "Rate limit reached for gpt-4o in organization org-loopback on requests per min "
                "(RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
                "requests",
                "rate_limit_exceeded",
            )
        else:
            body = litellm_error(
                "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached "
                "for requests. Received Model Group=loopback-model\nAvailable Model Group "
                "Fallbacks=None",
                429,
            )
        self.fail(429, body, times=times, headers=retry_after_header(retry_after))

    def insufficient_quota(self, *, times: int = 1) -> None:
        self.fail(
            429,
            openai_error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
            times=times,
        )

    def server_error(self, status: int = 500, *, times: int = 1) -> None:
        messages = {
            500: "The server had an error while processing your request. Sorry about that!",
            502: "Bad gateway.",
            503: "The engine is currently overloaded, please try again later",
        }
        body = openai_error(messages.get(status, "Internal error"), "server_error", None)
        self.fail(status, body, times=times)

    def unknown_model(self, status: Literal[404, 400] = 404, *, times: int = 1) -> None:
        """The model is gone: OpenAI's 404 ``model_not_found``, or LiteLLM's 400."""
        self._add(Behaviour("unknown_model", times, status=status))

    def unauthorized(self, status: Literal[401, 403] = 401, *, times: int = 1) -> None:
        if status == 401:
            body = openai_error(
                "Incorrect API key provided: sk-***. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        else:
            body = openai_error(
                "Country, region, or territory not supported", "request_forbidden", None
            )
        self.fail(status, body, times=times)

    def stall(self, *, times: int = 1) -> None:
        """Record the request, then answer nothing until the client gives up (or
        ``stall_seconds``), then close the connection."""
        self._add(Behaviour("stall", times))

    def drop(self, *, times: int = 1) -> None:
        """Record the request, then close the connection without an answer."""
        self._add(Behaviour("drop", times))

    def before_answer(self, callback: Callable[[Recorded], None]) -> None:
        """Run ``callback`` (in the server's thread) once, after the next completion is made and
        before it is sent: what happens between the model's answer and the client's keep."""
        with self.lock:
            self._before_answer.append(callback)

    def clear(self) -> None:
        self._queue.clear()
        with self.lock:
            self._before_answer.clear()
        self.default = Behaviour("answer")

    def take(self) -> Behaviour:
        return self._queue.take(COMPLETION) or self.default

    def context_refusal(self, payload: dict[str, Any]) -> Any:
        """The body of a 400 for a request that exceeds :meth:`context_limit`, else None."""
        with self.lock:
            limit, wording = self.context_tokens, self.context_wording
        if limit is None:
            return None
        messages = payload.get("messages") or []
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        prompt = math.ceil(chars / 4)
        answer = payload.get("max_tokens", payload.get("max_completion_tokens"))
        answer = answer if isinstance(answer, int) else 0
        if prompt + answer <= limit:
            return None
        return context_body(wording, str(payload.get("model")), limit, prompt, answer)

    # -- reading -------------------------------------------------------------------------------

    def completions(self) -> list[Recorded]:
        """Every chat completion request received (answered or not)."""
        with self.lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def completion(self, behaviour: Behaviour, request: Recorded) -> dict[str, Any]:
        """The completion answering ``request`` with ``behaviour``'s text and tool calls."""
        body = request.body if isinstance(request.body, dict) else {}
        return completion_body(behaviour.text, behaviour.tool_calls, body, MODEL)

    # -- the API -------------------------------------------------------------------------------

    def answer_headers(self, path: str) -> dict[str, str]:
        return {"x-request-id": f"req_{uuid.uuid4().hex[:16]}"}

    def serve(self, request: Received, exchange: Exchange) -> None:
        try:
            payload: Any = request.json()
        except ValueError:
            payload = request.raw.decode(errors="replace")
        recorded = Recorded(request.method, request.target, request.headers, payload)
        with self.lock:
            self.requests.append(recorded)
        self.changed()
        method, path = request.method, request.target
        if self.api_key is not None and request.headers.get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            exchange.send(
                401,
                openai_error(
                    "You didn't provide an API key, or it is not the right one.",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
            return
        if method == "GET" and path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "loopback"} for m in self.models]
            exchange.send(200, {"object": "list", "data": data})
            return
        if method != "POST" or path != "/v1/chat/completions":
            exchange.send(
                404, openai_error(f"Invalid URL ({method} {path})", "invalid_request_error", None)
            )
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
            exchange.send(
                400,
                openai_error(
                    "'messages' is a required property", "invalid_request_error", None, "messages"
                ),
            )
            return
        self._complete(payload, recorded, exchange)

    def _complete(self, payload: dict[str, Any], recorded: Recorded, exchange: Exchange) -> None:
        behaviour = self.take()
        model = str(payload.get("model"))
        if behaviour.mode == "unknown_model":
            exchange.send(*unknown_model_body(behaviour.status, model))
            return
        if model not in self.models:
            exchange.send(*unknown_model_body(404, model))
            return
        if self.refuse_max_tokens and "max_tokens" in payload:
            exchange.send(400, MAX_TOKENS_REFUSED)
            return
        refusal = self.context_refusal(payload)
        if refusal is not None:
            exchange.send(400, refusal)
            return
        match behaviour.mode:
            case "status":
                exchange.send(behaviour.status, behaviour.body, behaviour.headers)
            case "stall":
                self.stall_here()
                exchange.drop()
            case "drop":
                exchange.drop()
            case "answer":
                self._answer(behaviour, model, recorded, exchange)

    def _answer(
        self, behaviour: Behaviour, model: str, recorded: Recorded, exchange: Exchange
    ) -> None:
        with self.lock:
            limit = self.max_parallel_requests
            full = limit is not None and self.in_flight >= limit
            if full:
                self.parallel_refused += 1
            else:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.changed()
        if full:
            exchange.send(*capacity_body("max_parallel_requests", model))
            return
        try:
            self._answers.wait(self.stall_seconds)
            if self.delay_seconds:
                time.sleep(self.delay_seconds)
        finally:
            with self.lock:
                self.in_flight -= 1
            self.changed()
        answer = self.completion(behaviour, recorded)
        with self.lock:
            callbacks = list(self._before_answer)
            self._before_answer.clear()
            self.served.append(recorded)
        for callback in callbacks:
            callback(recorded)
        exchange.send(200, answer)
