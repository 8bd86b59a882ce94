"""``ModelGateway``: the only code that talks to the model, one OpenAI-compatible chat completion
over ``httpx``, and what its answers mean.

The request carries **no tools**: no ``tools``, ``tool_choice``, ``functions`` or
``function_call``, so whatever the report says, the model can only answer with text. The report's
text is the user message, under a fixed system prompt (:data:`SYSTEM_PROMPT`); nothing else of
the report (its id, its reporter) is sent. Only the answer's ``message.content`` string is read:
a ``tool_calls`` or ``refusal`` in the answer is never acted upon.

The client never retries and follows no redirect (the OpenAI client's own retries are what the
outbox already does, with its attempts and backoff). A failure is one of five exceptions, which
the adapter maps to its results (:func:`outbox_draft.adapter.result_for`):

- :class:`ProxyBusy`: the proxy refused for its own capacity, in a wording of the one table of
  them (:data:`outbox_draft.capacity.CAPACITY`);
- :class:`UpstreamFailed`: the call failed and a later one may succeed (a timeout, a lost
  connection, a 5xx, an upstream provider's rate limit, an answer without text);
- :class:`ModelRefused`: the model is gone or the proxy refuses it, which no wait cures (404,
  400 naming the model, 401, 403, 429 ``insufficient_quota`` and LiteLLM's budget, a redirect:
  the base URL is not the API's);
- :class:`ContextExceeded`: the report and the answer do not fit the model's context (OpenAI's
  400 ``context_length_exceeded``, LiteLLM's ``ContextWindowExceededError``, vLLM's "maximum
  context length");
- :class:`RequestRefused`: any other 4xx (the request itself).

Each one's :attr:`~ModelError.detail` is what the action keeps (``last_detail``): the status,
the provider's code and a reason in this package's words, never the provider's message, which
may quote what was sent (the report's text). The message goes only to the log event.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox_core import retry_after
from outbox_core.http_results import HttpFailure, Proof

from .capacity import CapacityWording, capacity_refusal
from .prompt import SYSTEM_PROMPT
from .settings import DraftSettings

if TYPE_CHECKING:
    import httpx

TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")
"""Request fields that would let the model act; a draft's request never has one."""

_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?) ?s", re.IGNORECASE)
# OpenAI's billing refusals (429, error.type insufficient_quota, the cause in error.code).
_QUOTA = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "budget_exceeded",  # LiteLLM's key, user or team budget (ProxyErrorTypes)
    }
)
# The model's context is too small for the request: OpenAI's code, LiteLLM's exception (whose
# message also names the model group, so it is read before a 400 naming the model), and the
# words of OpenAI's, vLLM's and DeepSeek's message ("This model's maximum context length is").
_CONTEXT_CODE = "context_length_exceeded"
_CONTEXT_WORDS = ("contextwindowexceedederror", "maximum context length")
# A provider's code or type as the action may keep it: a name, not free text ("None", a status
# number and anything longer are left out).
_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Report:
    """What a draft is made from: the report's text of one generation."""

    report_id: str
    generation: int
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """The model's answer: its text only, and what the proxy said about it."""

    text: str
    completion_id: str | None
    model: str | None
    finish_reason: str | None
    usage: Usage

    def title_and_body(self, limit: int) -> tuple[str, str]:
        """The answer as the issue's title (its first line, without Markdown's heading or
        emphasis marks) and body (the rest, or the whole answer when it has one line), at most
        ``limit`` characters."""
        text = self.text.strip()[:limit]
        lines = text.splitlines()
        first = next((line for line in lines if line.strip()), "")
        title = re.sub(r"^(?:[#*_>\s]+|title:\s*)+", "", first.strip(), flags=re.IGNORECASE)
        title = title.strip("*_ ").strip()[:256]
        rest = text[text.index(first) + len(first) :].strip() if first else ""
        return title, rest or text


# -- failures ------------------------------------------------------------------------------------


class ModelError(Exception):
    """A call that did not bring an answer: ``reason`` in this package's words, the HTTP
    ``status`` and the provider's ``code`` when they came, and the provider's own ``message``
    (for the log only). ``str()`` is the status and the provider's message."""

    def __init__(
        self, reason: str, *, status: int | None = None, code: str | None = None, message: str = ""
    ) -> None:
        words = message[:200] if message else reason
        super().__init__(f"HTTP {status}: {words}" if status is not None else words)
        self.reason = reason
        self.status = status
        self.code = code
        self.message = message

    @property
    def detail(self) -> str:
        """What the action keeps of this failure: the status, the code, the reason."""
        head = " ".join(
            part
            for part in (f"HTTP {self.status}" if self.status is not None else "", self.code or "")
            if part
        )
        return f"{head}: {self.reason}" if head else self.reason

    proof: Proof = Proof.UNANSWERED
    """What the failure proves in the core's mapping (``outbox_core.http_results``); the
    adapter maps what differs (the proxy's capacity, the model's refusals) itself."""

    @property
    def failure(self) -> HttpFailure:
        """This failure as the core's HTTP mapping reads it."""
        return HttpFailure(self.proof, self.detail, status=self.status)


class ProxyBusy(ModelError):
    """The proxy refused for its own capacity (``wording``, a row of the capacity table);
    ``wait`` is what it asked for, if anything."""

    def __init__(
        self, wording: CapacityWording, *, status: int, wait: timedelta | None, message: str
    ) -> None:
        super().__init__(
            f"{wording.server} {wording.name} (the proxy's capacity)",
            status=status,
            code=wording.name,
            message=message,
        )
        self.wording = wording
        self.wait = wait

    @property
    def detail(self) -> str:
        return f"{self.wording.server} {self.status} {self.wording.name} (the proxy's capacity)"


class UpstreamFailed(ModelError):
    """The call failed and a later one may succeed; ``wait`` is a ``Retry-After``, if any."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        code: str | None = None,
        message: str = "",
        wait: timedelta | None = None,
    ) -> None:
        super().__init__(reason, status=status, code=code, message=message)
        self.wait = wait

    # An upstream provider's rate limit (a 429 not in the capacity table) is no answer of the
    # model's, not a limit of the proxy's: it spends an attempt, so that a throttled provider
    # is not absorbed into waits that never end.
    proof = Proof.UNANSWERED

    @property
    def failure(self) -> HttpFailure:
        return HttpFailure(self.proof, self.detail, status=self.status, wait=self.wait)


class ModelRefused(ModelError):
    """The model is gone, or the proxy refuses this key or this model: no wait cures it."""


class ContextExceeded(ModelError):
    """The report and the answer do not fit the model's context: no retry cures it."""


class RequestRefused(ModelError):
    """The proxy refused this request (any other 4xx)."""

    proof = Proof.REFUSED


def _error_object(body: Any) -> dict[str, Any]:
    """The error object of an error body: OpenAI's and LiteLLM's ``{"error": {...}}``, or
    vLLM's older top-level ``{"object": "error", "message": ...}``."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict):
            return inner
        if isinstance(inner, str):
            return {"message": inner}
        if "message" in body or "detail" in body:
            return {"message": body.get("message", body.get("detail")), **body}
    return {}


def _code(error: dict[str, Any]) -> str | None:
    """The provider's code (else its type) when it is a name."""
    for value in (error.get("code"), error.get("type")):
        text = str(value) if value is not None else ""
        if text != "None" and _CODE.match(text):
            return text
    return None


def classify(
    status: int, body: Any, headers: httpx.Headers | dict[str, str], model: str
) -> ModelError:
    """The failure that a non-2xx answer proves (the table in the adapter's docstring).

    A 429 or 503 is the proxy's own capacity only in a wording of the capacity table
    (:func:`~outbox_draft.capacity.capacity_refusal`, :class:`ProxyBusy`: wait without
    spending an attempt); every other 429 is an upstream limit (:class:`UpstreamFailed`: an
    attempt spent, so a throttled provider is not absorbed into waits that never end), except
    a billing refusal (``insufficient_quota``, LiteLLM's ``budget_exceeded``), which no wait
    cures (:class:`ModelRefused`). A 400 that says the context is too small is
    :class:`ContextExceeded`, read before a 400 naming the model (LiteLLM's message names the
    model group whatever went wrong)."""
    error = _error_object(body)
    message = str(error.get("message") or "")
    kind = str(error.get("type") or "")
    raw_code = str(error.get("code") or "")
    param = str(error.get("param") or "")
    code = _code(error)
    lowered = message.lower()
    wait = retry_after(headers.get("retry-after"), date=headers.get("date"))
    if status == 429 or status == 503:
        if kind in _QUOTA or raw_code in _QUOTA or "budget has been exceeded" in lowered:
            return ModelRefused(
                "no quota or budget left", status=status, code=code, message=message
            )
        wording = capacity_refusal(status, message)
        if wording is not None:
            if wait is None:
                found = _TRY_AGAIN.search(message)
                wait = timedelta(seconds=float(found.group(1))) if found else None
            return ProxyBusy(wording, status=status, wait=wait, message=message)
        reason = "a rate limit upstream" if status == 429 else "the server is unavailable"
        return UpstreamFailed(reason, status=status, code=code, message=message, wait=wait)
    if 300 <= status < 400:
        return ModelRefused(
            "a redirect: the base URL is not the API's", status=status, code=code, message=message
        )
    if status in (401, 403):
        return ModelRefused("the key is refused", status=status, code=code, message=message)
    if status == 404:
        return ModelRefused(
            "the proxy serves no such model or endpoint", status=status, code=code, message=message
        )
    if status == 400 and (
        raw_code == _CONTEXT_CODE or any(words in lowered for words in _CONTEXT_WORDS)
    ):
        return ContextExceeded(
            "the report and the answer do not fit the model's context",
            status=status,
            code=code,
            message=message,
        )
    if status == 400 and (
        raw_code == "model_not_found"
        or param == "model"
        or (len(model) > 1 and model.lower() in lowered)
        or "invalid model" in lowered
    ):
        return ModelRefused(
            "the proxy refuses the model", status=status, code=code, message=message
        )
    if status in (408, 409) or status >= 500:
        return UpstreamFailed(
            "the server failed", status=status, code=code, message=message, wait=wait
        )
    return RequestRefused("the request was refused", status=status, code=code, message=message)


def request_body(settings: DraftSettings, text: str) -> dict[str, Any]:
    """The chat completion request of a draft: the model, the fixed system prompt, the report's
    text as the user message, the answer's length; no tools."""
    assert settings.model is not None
    return {
        "model": settings.model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": text},
        ],
        settings.token_parameter: settings.max_tokens,
        "stream": False,
    }


def read_answer(body: Any) -> Answer:
    """The answer of a 2xx body, or :class:`UpstreamFailed` when it holds no text."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise UpstreamFailed(
            "the answer is not a chat completion (no choices[0].message)"
        ) from None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str) or not content.strip():
        raise UpstreamFailed("the model answered no text")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}

    def count(name: str) -> int | None:
        value = usage.get(name)
        return value if isinstance(value, int) else None

    return Answer(
        text=content,
        completion_id=body.get("id") if isinstance(body.get("id"), str) else None,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
        usage=Usage(count("prompt_tokens"), count("completion_tokens"), count("total_tokens")),
    )


class ModelGateway:
    """One chat completion per draft through an OpenAI-compatible proxy."""

    def __init__(self, settings: DraftSettings) -> None:
        import httpx

        if settings.base_url is None or settings.model is None:
            raise ValueError(f"the draft is not configured: set {', '.join(settings.missing)}")
        self.settings = settings
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            **settings.bearer(),
        }
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(
                settings.request_timeout_seconds, connect=settings.connect_timeout_seconds
            ),
            limits=httpx.Limits(
                max_connections=settings.max_concurrency,
                max_keepalive_connections=settings.max_concurrency,
            ),
            # No retries of its own (retries=0 is httpx's default; said here so it stays so).
            transport=httpx.AsyncHTTPTransport(retries=0),
            follow_redirects=False,
        )

    async def draft(self, report: Report) -> Answer:
        """Ask the model for the draft of ``report``: its answer, or a :class:`ModelError`."""
        import httpx

        settings = self.settings
        assert settings.model is not None
        try:
            response = await self._client.post(
                settings.completions_url, json=request_body(settings, report.text)
            )
        except httpx.TimeoutException as exc:
            raise UpstreamFailed(f"no answer in time ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise UpstreamFailed(f"the call failed ({type(exc).__name__})") from None
        try:
            body: Any = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not response.is_success:
            raise classify(response.status_code, body, response.headers, settings.model)
        return read_answer(body)

    async def aclose(self) -> None:
        await self._client.aclose()
