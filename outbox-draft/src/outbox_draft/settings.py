"""Model-proxy settings: ``OUTBOX_DRAFT_*`` environment variables, or the ``[outbox.draft]``
table of the file ``OUTBOX_CONFIG`` names. The API key is a ``SecretStr`` and never printed."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from outbox_core.http_settings import HttpProviderSettings

from .prompt import prompt_tokens


class DraftSettings(HttpProviderSettings):
    """How ``DRAFT_REPORT`` reaches the model. Every field is also ``OUTBOX_DRAFT_<NAME>`` in the
    environment. Without ``base_url`` and ``model`` no draft is made: ``submit_report`` files the
    report's own text and says so. The base URL's check, the connect timeout and the bearer
    token are the core's HTTP provider settings (``outbox_core.http_settings``)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_DRAFT_", extra="ignore")
    toml_section: ClassVar[str] = "outbox.draft"
    url_fields: ClassVar[tuple[str, ...]] = ("base_url",)
    url_expected: ClassVar[str] = (
        "an http(s) URL up to and with /v1, such as http://localhost:4000/v1"
    )
    token_field: ClassVar[str | None] = "api_key"

    base_url: str | None = Field(
        default=None,
        description="the OpenAI-compatible API's base URL, up to and with /v1: "
        "http://litellm:4000/v1, http://vllm:8000/v1, http://ollama:11434/v1, "
        "https://api.openai.com/v1; the draft POSTs to <base_url>/chat/completions",
    )
    model: str | None = Field(
        default=None, description="the model name the proxy serves (its model_name / alias)"
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="sent as 'Authorization: Bearer <key>' (a LiteLLM virtual key, an OpenAI "
        "key); unset: no Authorization header (vLLM, Ollama without auth)",
    )
    max_tokens: int = Field(default=800, ge=16, le=32_000, description="the answer's length")
    token_parameter: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        description="the request field that carries max_tokens: max_tokens (what compatible "
        "proxies accept) or max_completion_tokens (OpenAI's newer models refuse max_tokens)",
    )
    max_report_chars: int = Field(
        default=20_000,
        ge=1,
        description="a longer report is refused at submit (nothing written): its draft would "
        "cost more than it helps",
    )
    context_tokens: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="the model's context window in tokens (LiteLLM's max_input_tokens, vLLM's "
        "--max-model-len, Ollama's num_ctx, the model's documented context); set, a report "
        "whose estimated prompt and max_tokens do not fit is refused at submit (nothing "
        "written). Unset: only the model's own refusal tells (CONTEXT_LENGTH_EXCEEDED)",
    )
    max_answer_chars: int = Field(
        default=20_000, ge=100, description="a longer answer is cut to this length when kept"
    )
    request_timeout_seconds: float = Field(
        default=50.0,
        gt=0,
        description="the model's answer (read and write); with the connect timeout below the "
        "core's fence margin (60 s), so a call never outlives its attempt's lease",
    )
    max_concurrency: int = Field(
        default=4, ge=1, le=1000, description="model calls in flight per executor"
    )
    max_in_flight_total: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="model calls in flight across every replica, kept in PostgreSQL; unset: "
        "only the per-executor limit. A full limit defers the draft (no attempt spent)",
    )
    capacity_wait_seconds: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="how long a draft waits after the proxy said it is busy without naming a "
        "wait (no Retry-After), or after the cross-replica limit was full",
    )

    @field_validator("context_tokens")
    @classmethod
    def _room_for_a_report(cls, value: int | None, info: ValidationInfo) -> int | None:
        max_tokens = info.data.get("max_tokens")
        if value is not None and isinstance(max_tokens, int):
            floor = max_tokens + prompt_tokens("")
            if value <= floor:
                raise ValueError(
                    f"must exceed {floor}: the answer's max_tokens ({max_tokens}, "
                    f"{cls.variable('max_tokens')}) and the system prompt (about "
                    f"{floor - max_tokens} tokens) leave no room for a report; set the model's "
                    "context, or lower the max_tokens"
                )
        return value

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("a model name, or unset for no draft")
        return value

    @property
    def missing(self) -> list[str]:
        """The variables a draft needs that are unset (empty: configured)."""
        return [
            self.variable(name) for name in ("base_url", "model") if getattr(self, name) is None
        ]

    @property
    def completions_url(self) -> str:
        assert self.base_url is not None
        return f"{self.base_url}/chat/completions"
