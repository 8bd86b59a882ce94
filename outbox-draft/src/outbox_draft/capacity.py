"""The capacity refusals of the proxy itself: the one table of the wordings that mean "this
server is full now, nothing was sent to the model", each with the server, the status it comes
with and where it was seen. The gateway reads a refusal by it (:func:`capacity_refusal`) and
the adapter defers such a draft (``Defer``, ``DRAFT_DEFERRED``, no attempt spent); the README's
"Capacity refusals" table restates it row by row (a test compares the two).

**Why the wording and not the status or the type.** LiteLLM answers its own capacity refusals
and an upstream provider's rate limit that it passes on with the same status (429) and the
same body shape (``{"error": {"message", "type", "param", "code": "429"}}``), and its newer
releases give both the type ``throttling_error`` and the prefix ``litellm.RateLimitError:``.
Only the message says whose limit it is. A provider's rate limit stays an attempt spent
(``Retry``), so that a throttled provider is not absorbed into waits that never end; the
proxy's own limits are a wait of the proxy: a draft behind them is not at fault.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CapacityWording:
    """One capacity refusal: ``status`` and a message holding ``words`` (in any case)."""

    server: str
    status: int
    words: str
    name: str
    """A short name, the refusal's part of the action's ``last_detail``."""
    limit: str
    """Whose limit was full."""
    seen: str
    """The version (or the dated reports) where this wording was seen."""


CAPACITY: tuple[CapacityWording, ...] = (
    CapacityWording(
        "LiteLLM",
        429,
        "Deployment has all max_parallel_requests slots in use",
        "max_parallel_requests",
        "the deployment's max_parallel_requests (or the one its rpm/tpm derive), per proxy worker",
        "the router of the releases that refuse a call over the limit instead of queueing it "
        "(LiteLLM's routing docs, Max Parallel Requests; type throttling_error, prefix "
        "litellm.RateLimitError); met against a live proxy in issue 31, version not pinned",
    ),
    CapacityWording(
        "LiteLLM",
        429,
        "No deployments available for selected model",
        "no_deployments",
        "every deployment of the model cooling down or at its rpm/tpm (the router)",
        "2024-05 (BerriAI/litellm#3933) and later (#5177; microsoft/agent-lightning#290 in "
        "2025-11; #20867 without 'Try again in N seconds'); a 429 since #2493, 2024-03",
    ),
    CapacityWording(
        "LiteLLM",
        429,
        "No healthy deployment available",
        "no_healthy_deployment",
        "every deployment of the model unhealthy (the router)",
        "routers of 2024-03 to 2024-04 (BerriAI/litellm#2493 maps it to 429)",
    ),
    CapacityWording(
        "LiteLLM",
        429,
        "Max parallel request limit reached",
        "key_max_parallel",
        "a key's, user's or team's max_parallel_requests (the proxy's limiter)",
        "up to 1.60.5 (BerriAI/litellm#8392)",
    ),
    CapacityWording(
        "LiteLLM",
        429,
        "Crossed TPM, RPM Limit",
        "key_tpm_rpm",
        "a key's, user's or team's tpm, rpm or parallel limit (the proxy's limiter)",
        "1.60.8 (BerriAI/litellm#8392)",
    ),
    CapacityWording(
        "LiteLLM",
        429,
        "Crossed TPM / RPM / Max Parallel Request Limit",
        "key_limits",
        "a key's, user's or team's tpm, rpm or parallel limit (the proxy's limiter)",
        "2025-03 (BerriAI/litellm#9440) to latest-stable of 2025-08 (#13898)",
    ),
    CapacityWording(
        "Ollama",
        503,
        "server busy, please try again",
        "queue_full",
        "its queue of pending requests (OLLAMA_MAX_QUEUE, 512 by default)",
        "0.1.33 and later (ollama/ollama#4144, #4159); the same words on /v1 and /api",
    ),
)
"""Every wording the draft defers on; anything else is not the proxy's capacity."""


def capacity_refusal(status: int, message: str) -> CapacityWording | None:
    """The row of :data:`CAPACITY` that a refusal with ``status`` and ``message`` is, if any."""
    lowered = message.lower()
    for wording in CAPACITY:
        if wording.status == status and wording.words.lower() in lowered:
            return wording
    return None
