"""outbox-draft: the ``DRAFT_REPORT`` kind, one model call through an OpenAI-compatible proxy
(LiteLLM, vLLM, Ollama's ``/v1``, OpenAI) whose answer titles and summarises a product-feedback
report of ``outbox-issues`` before its issue is filed.

Install it next to outbox-issues and configure the proxy (``OUTBOX_DRAFT_BASE_URL``,
``OUTBOX_DRAFT_MODEL``): ``submit_report`` then enqueues the draft in the report's lane ahead of
``FILE_ISSUE``. The request carries no tools; the answer is kept as text on the filing under
the attempt's lease. :mod:`outbox_draft.testing` holds a loopback OpenAI-compatible server.
"""

from .adapter import DRAFT_DEFERRED, DRAFT_REPORT, DraftReportAdapter
from .draftable import check_draftable
from .enqueue import draft_key, draft_request
from .gateway import Answer, ModelGateway, Report
from .prompt import SYSTEM_PROMPT
from .settings import DraftSettings

__all__ = [
    "DRAFT_DEFERRED",
    "DRAFT_REPORT",
    "SYSTEM_PROMPT",
    "Answer",
    "DraftReportAdapter",
    "DraftSettings",
    "ModelGateway",
    "Report",
    "check_draftable",
    "draft_key",
    "draft_request",
]
