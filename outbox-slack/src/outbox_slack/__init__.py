"""outbox-slack: the ``SLACK_POST`` kind of outbox, one Slack message per turn.

Store a turn's admitted entries and enqueue its post with :func:`post_turn` in the transaction
that admits them; :class:`SlackPostAdapter` posts it once that commits, with Slack message
metadata that lets an attempt after an unknown write find the post instead of posting twice.
:func:`redact` removes an entry's text, and with the last one the turn's ended post.
"""

from .adapter import KIND, SlackPost, SlackPostAdapter, idempotency_key, lane_key
from .domain import Entry, Redacted, SlackPersonData, aredact, parse_ref, redact, redact_steps
from .enqueue import apost_turn, post_turn, post_turn_steps
from .errors import TurnAlreadyPosted, UnknownEntry
from .settings import SlackSettings
from .slack_api import (
    ERROR_REASONS,
    EVENT_TYPE,
    SLACK_HISTORY_UNREADABLE,
    SLACK_REDACTED,
    SLACK_REFUSED,
    STOP_REASONS,
)

__all__ = [
    "ERROR_REASONS",
    "EVENT_TYPE",
    "KIND",
    "SLACK_HISTORY_UNREADABLE",
    "SLACK_REDACTED",
    "SLACK_REFUSED",
    "STOP_REASONS",
    "Entry",
    "Redacted",
    "SlackPersonData",
    "SlackPost",
    "SlackPostAdapter",
    "SlackSettings",
    "TurnAlreadyPosted",
    "UnknownEntry",
    "apost_turn",
    "aredact",
    "idempotency_key",
    "lane_key",
    "parse_ref",
    "post_turn",
    "post_turn_steps",
    "redact",
    "redact_steps",
]
