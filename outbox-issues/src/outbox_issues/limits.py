"""What GitHub takes whole, checked before anything is written: a write that GitHub would
refuse (422 Validation Failed) is refused at enqueue instead, with an error naming the limit.

GitHub's documented and observed limits for what these kinds write:

- an issue's, an issue comment's and a review comment's **body**: at most 65,536 characters
  (``body is too long (maximum is 65536 characters)``). Characters are Unicode code points,
  as GitHub's Ruby counts a string (Python's ``len``): an emoji is one, not two as in UTF-16.
  Measured so, a body within the limit is also within the 262,144 UTF-8 bytes (four per code
  point at most) that some have measured the limit as.
- an issue's **title**: at most 256 characters, and not blank. GitHub calls a title blank that
  holds only invisible characters (U+FEFF passes ``str.strip()`` and is refused, 422
  ``missing_field``), so a title must keep a visible character once whitespace, control and
  format characters (zero-width spaces and joiners, the byte order mark, bidirectional marks,
  soft hyphens), combining marks standing alone, and the letters that render as blank (the
  Hangul fillers, the braille blank) are removed.
"""

from __future__ import annotations

import unicodedata

from outbox_core import InvalidRequest

MAX_BODY = 65_536
"""The most characters (code points) GitHub keeps in an issue's or a comment's body."""
MAX_TITLE = 256
"""The most characters of an issue's title."""

# Letters (Lo, So) that render as nothing: Hangul fillers and the braille blank.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Whitespace, control, format, separator, unassigned and lone combining marks.
_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cn", "Mn", "Me"})


def visible(text: str) -> str:
    """``text`` without the characters that show nothing (see the module's docstring)."""
    return "".join(
        char
        for char in text
        if char not in _BLANK_LETTERS and unicodedata.category(char) not in _INVISIBLE_CATEGORIES
    )


def check_title(field: str, title: object) -> str:
    """A title GitHub takes: text with a visible character, at most :data:`MAX_TITLE`."""
    if not isinstance(title, str) or not visible(title):
        raise InvalidRequest(
            field,
            "must hold a visible character: GitHub refuses a title of spaces or invisible "
            "characters (U+FEFF, zero-width spaces and the like) with 422",
        )
    if len(title) > MAX_TITLE:
        raise InvalidRequest(
            field, f"must be at most {MAX_TITLE} characters (GitHub's limit), got {len(title)}"
        )
    return title


def check_body(field: str, body: str, what: str) -> None:
    """Refuse a ``body`` GitHub would not take whole: more than :data:`MAX_BODY` characters
    once composed as ``what`` (the issue, the summary comment, a review comment), the
    markers and the notice this package adds included."""
    if len(body) > MAX_BODY:
        raise InvalidRequest(
            field,
            f"{what} would be {len(body):,} characters with what this package adds; GitHub "
            f"keeps at most {MAX_BODY:,} (422 Validation Failed): shorten it by "
            f"{len(body) - MAX_BODY:,}",
        )
