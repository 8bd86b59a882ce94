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

Only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from ..settings import DraftSettings

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


def _openai_error(message: str, kind: str, code: str | None, param: str | None = None) -> Any:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _litellm_error(message: str, code: int, kind: str = "None", param: Any = "None") -> Any:
    """LiteLLM's ProxyException body: type and param the strings "None" (its older releases;
    newer ones name the type, ``throttling_error``, and send a null param), code a string."""
    return {"error": {"message": message, "type": kind, "param": param, "code": str(code)}}


def _ollama_error(message: str) -> Any:
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
            return 429, _litellm_error(message, 429)
        case "no_healthy_deployment":
            return 429, _litellm_error(
                f"No healthy deployment available, passed model={model}", 429
            )
        case "max_parallel_requests":
            message = (
                "litellm.RateLimitError: Deployment has all max_parallel_requests slots in use. "
                f"Deployment model_group={model}, id=3f1c9e0a already has "
                "max_parallel_requests=2 requests in flight. Raise max_parallel_requests (or "
                "the rpm/tpm it is derived from) for this deployment. Received Model "
                f"Group={model}\nAvailable Model Group Fallbacks=None"
            )
            return 429, _litellm_error(message, 429, "throttling_error", None)
        case "key_max_parallel":
            return 429, _litellm_error("Max parallel request limit reached.", 429)
        case "key_tpm_rpm":
            message = (
                "LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM, RPM Limit. "
                "current rpm: 1, rpm limit: 1, current tpm: 0, tpm limit: 9223372036854775807"
            )
            return 429, _litellm_error(message, 429)
        case "key_limits":
            message = (
                "LiteLLM Rate Limit Handler for rate limit type = key. Crossed TPM / RPM / Max "
                "Parallel Request Limit. current rpm: 1, rpm limit: 1, current tpm: 348, tpm "
                "limit: 9223372036854775807, current max_parallel_requests: 1, "
                "max_parallel_requests: 1"
            )
            return 429, _litellm_error(message, 429)
        case "queue_full":
            return 503, _ollama_error(
                "server busy, please try again.  maximum pending requests exceeded"
            )


ContextWording = Literal["openai", "litellm", "vllm"]


def context_body(wording: ContextWording, model: str, limit: int, prompt: int, answer: int) -> Any:
    """The 400 a server sends for a request longer than the model's context: OpenAI's
    ``context_length_exceeded``, LiteLLM's ``ContextWindowExceededError`` (its message names the
    model group), vLLM's ``BadRequestError``."""
    match wording:
        case "openai":
            return _openai_error(
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
            return _litellm_error(message, 400, "None", "None")
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


class ModelTestServer:
    """Start with ``with ModelTestServer() as server:`` (or :meth:`start`/:meth:`stop`)."""

    def __init__(
        self,
        *,
        models: tuple[str, ...] = (MODEL,),
        api_key: str | None = API_KEY,
        stall_seconds: float = 30.0,
        refuse_max_tokens: bool = False,
    ) -> None:
        self.models = list(models)
        self.api_key = api_key
        self.stall_seconds = stall_seconds
        self.refuse_max_tokens = refuse_max_tokens
        """Answer ``max_tokens`` as OpenAI's newer models do (400: use max_completion_tokens)."""
        self.lock = threading.RLock()
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
        self._changed = threading.Condition(self.lock)
        self._answers_go = threading.Event()
        self._answers_go.set()
        self._queue: list[Behaviour] = []
        self._release = threading.Event()
        self._before_answer: list[Callable[[Recorded], None]] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._port = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> ModelTestServer:
        server = self

        class Handler(_Handler):
            model_server = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._port = int(self._httpd.server_address[1])
        threading.Thread(
            target=self._httpd.serve_forever, name="model-test-server", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._answers_go.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ModelTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._port, "start the server first"
        return self._port

    @property
    def base_url(self) -> str:
        """The base URL as the OpenAI client has it, up to and with ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

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
        with self.lock:
            self._queue.append(behaviour)

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
        headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
        self.fail(status, body, times=times, headers=headers)

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
        self._answers_go.clear()

    def release_answers(self) -> None:
        self._answers_go.set()

    def wait_until(
        self, condition: Callable[[ModelTestServer], bool], timeout: float = 30.0
    ) -> bool:
        """Wait until ``condition(server)`` holds (checked whenever a request arrives or is
        answered); False when ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)

    def upstream_rate_limit(
        self, *, times: int = 1, openai: bool = False, retry_after: float | None = None
    ) -> None:
        """An upstream provider's rate limit: as LiteLLM passes it on, or as OpenAI sends it."""
        if openai:
            body = _openai_error(
                "Rate limit reached for gpt-4o in organization org-loopback on requests per min "
                "(RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
                "requests",
                "rate_limit_exceeded",
            )
        else:
            body = _litellm_error(
                "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached "
                "for requests. Received Model Group=loopback-model\nAvailable Model Group "
                "Fallbacks=None",
                429,
            )
        headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
        self.fail(429, body, times=times, headers=headers)

    def insufficient_quota(self, *, times: int = 1) -> None:
        self.fail(
            429,
            _openai_error(
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
        body = _openai_error(messages.get(status, "Internal error"), "server_error", None)
        self.fail(status, body, times=times)

    def unknown_model(self, status: Literal[404, 400] = 404, *, times: int = 1) -> None:
        """The model is gone: OpenAI's 404 ``model_not_found``, or LiteLLM's 400."""
        self._add(Behaviour("unknown_model", times, status=status))

    def unauthorized(self, status: Literal[401, 403] = 401, *, times: int = 1) -> None:
        if status == 401:
            body = _openai_error(
                "Incorrect API key provided: sk-***. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        else:
            body = _openai_error(
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
        with self.lock:
            self._queue.clear()
            self._before_answer.clear()
        self.default = Behaviour("answer")

    def release(self) -> None:
        """End every stall now."""
        self._release.set()

    def take(self) -> Behaviour:
        with self.lock:
            if not self._queue:
                return self.default
            behaviour = self._queue[0]
            behaviour.times -= 1
            if behaviour.times <= 0:
                self._queue.pop(0)
            return behaviour

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
        body = request.body if isinstance(request.body, dict) else {}
        message: dict[str, Any] = {"role": "assistant", "content": behaviour.text, "refusal": None}
        if behaviour.tool_calls is not None:
            message["tool_calls"] = behaviour.tool_calls
        prompt = sum(
            len(str(m.get("content", "")).split())
            for m in body.get("messages", [])
            if isinstance(m, dict)
        )
        completion = len(behaviour.text.split())
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", MODEL),
            "system_fingerprint": "fp_loopback",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if behaviour.tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    model_server: ModelTestServer
    protocol_version = "HTTP/1.1"
    server_version = "loopback-openai"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        server = self.model_server
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            payload: Any = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        recorded = Recorded(
            method, self.path, {k.lower(): v for k, v in self.headers.items()}, payload
        )
        with server.lock:
            server.requests.append(recorded)
            server._changed.notify_all()
        if server.api_key is not None and self.headers.get("authorization") != (
            f"Bearer {server.api_key}"
        ):
            self._send(
                401,
                _openai_error(
                    "You didn't provide an API key, or it is not the right one.",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
            return
        if method == "GET" and self.path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "loopback"} for m in server.models]
            self._send(200, {"object": "list", "data": data})
            return
        if method != "POST" or self.path != "/v1/chat/completions":
            self._send(
                404,
                _openai_error(f"Invalid URL ({method} {self.path})", "invalid_request_error", None),
            )
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
            self._send(
                400,
                _openai_error(
                    "'messages' is a required property", "invalid_request_error", None, "messages"
                ),
            )
            return
        behaviour = server.take()
        model = str(payload.get("model"))
        if behaviour.mode == "unknown_model":
            self._unknown_model(behaviour.status, model)
            return
        if model not in server.models:
            self._unknown_model(404, model)
            return
        if server.refuse_max_tokens and "max_tokens" in payload:
            self._send(
                400,
                _openai_error(
                    "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                    "'max_completion_tokens' instead.",
                    "invalid_request_error",
                    "unsupported_parameter",
                    "max_tokens",
                ),
            )
            return
        refusal = server.context_refusal(payload)
        if refusal is not None:
            self._send(400, refusal)
            return
        match behaviour.mode:
            case "status":
                self._send(behaviour.status, behaviour.body, behaviour.headers)
            case "stall":
                server._release.wait(server.stall_seconds)
                self._drop()
            case "drop":
                self._drop()
            case "answer":
                with server.lock:
                    limit = server.max_parallel_requests
                    full = limit is not None and server.in_flight >= limit
                    if full:
                        server.parallel_refused += 1
                    else:
                        server.in_flight += 1
                        server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server._changed.notify_all()
                if full:
                    self._send(*capacity_body("max_parallel_requests", model))
                    return
                try:
                    server._answers_go.wait(server.stall_seconds)
                    if server.delay_seconds:
                        time.sleep(server.delay_seconds)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                        server._changed.notify_all()
                answer = server.completion(behaviour, recorded)
                with server.lock:
                    callbacks = list(server._before_answer)
                    server._before_answer.clear()
                    server.served.append(recorded)
                for callback in callbacks:
                    callback(recorded)
                self._send(200, answer)

    def _unknown_model(self, status: int, model: str) -> None:
        if status == 400:
            message = (
                f"400: {{'error': '/chat/completions: Invalid model name passed in model={model}."
                " Call `/v1/models` to view available models for your key.'}"
            )
            self._send(400, _litellm_error(message, 400))
            return
        self._send(
            404,
            _openai_error(
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            ),
        )

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("x-request-id", f"req_{uuid.uuid4().hex[:16]}")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)
