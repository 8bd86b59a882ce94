"""What can be drafted: the one check of a report's text, made before anything is written, by
the draft hook of ``submit_report`` and ``edit_report`` (:func:`outbox_draft.draft_request`) and
by the kind's enqueue check on every other enqueue path
(:meth:`outbox_draft.DraftReportAdapter.check_enqueue`)."""

from __future__ import annotations

from outbox_core import InvalidRequest

from .prompt import CHARS_PER_TOKEN, fitting_chars, prompt_tokens
from .settings import DraftSettings


def check_draftable(text: object, settings: DraftSettings) -> str:
    """The report's text if it can be drafted, else :class:`~outbox_core.InvalidRequest`: an
    empty text, one longer than ``max_report_chars``, or one whose estimated prompt
    (:func:`~outbox_draft.prompt.prompt_tokens`) and the answer's ``max_tokens`` do not fit the
    model's ``context_tokens``, when that is set."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("text", "must be a non-empty string to be drafted")
    if len(text) > settings.max_report_chars:
        raise InvalidRequest(
            "text",
            f"is {len(text)} characters; a report is drafted up to {settings.max_report_chars} "
            f"({settings.variable('max_report_chars')}): shorten it or raise the limit",
        )
    context = settings.context_tokens
    if context is not None:
        needed = prompt_tokens(text) + settings.max_tokens
        if needed > context:
            raise InvalidRequest(
                "text",
                f"does not fit the model's context: its {len(text)} characters (about "
                f"{CHARS_PER_TOKEN} a token) with the system prompt and the answer's "
                f"{settings.max_tokens} tokens ({settings.variable('max_tokens')}) need about "
                f"{needed} tokens of the {context} ({settings.variable('context_tokens')}); "
                f"shorten it to about {fitting_chars(context, settings.max_tokens)} characters, "
                "or serve a model with a larger context",
            )
    return text
