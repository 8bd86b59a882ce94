"""What one ``SLACK_POST`` sends as its message's text, and Slack's limit on it.

The post is ``text`` only (no blocks, no attachments): the turn's unredacted entries in order,
joined by a blank line. Slack keeps at most :data:`TEXT_LIMIT` characters of
``chat.postMessage``'s ``text`` and cuts the rest, answering ``ok: true`` with the warning
``message_truncated`` (changelog "Truncating really long messages", August 2018). A turn whose
message is longer cannot be posted whole: it is refused at enqueue (``post_turn`` and the kind's
enqueue check) and never posted (the adapter, for a turn enqueued before this check).

Lengths are counted in UTF-16 code units, the stricter of the two ways "characters" are
counted (a character outside the Basic Multilingual Plane, such as most emoji, is two), so a
message this check lets through is whole under either count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from outbox_core import InvalidRequest

TEXT_LIMIT: Final = 40_000
"""The characters of ``chat.postMessage``'s ``text`` that Slack keeps."""

SEPARATOR: Final = "\n\n"


def message_text(texts: Sequence[str]) -> str:
    """The text of the one message a turn posts: its entries' texts, a blank line between."""
    return SEPARATOR.join(texts)


def text_length(text: str) -> int:
    """``text``'s length in UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def check_length(turn_id: str, texts: Sequence[str]) -> None:
    """Refuse (``InvalidRequest`` on ``entries``) a turn whose message Slack would cut."""
    length = text_length(message_text(texts))
    if length > TEXT_LIMIT:
        raise InvalidRequest(
            "entries",
            f"turn {turn_id!r} makes a message of {length:,} characters (UTF-16 code units, "
            f"entries joined by a blank line); Slack keeps {TEXT_LIMIT:,} of a message's text "
            "and cuts the rest: post it as several turns of at most "
            f"{TEXT_LIMIT:,} characters. Nothing was written",
        )
