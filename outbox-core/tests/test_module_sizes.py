"""A module of outbox_core over 450 lines says in its first lines why it is one piece (issue
33): a reader opening it learns at once that its length was chosen, or it is split where a
seam is."""

from __future__ import annotations

import re
from pathlib import Path

import outbox_core

PACKAGE = Path(outbox_core.__file__).resolve().parent
LIMIT = 450
# "Longer than 400 lines on purpose: ...", "(one module, a little over 400 lines, so that ...)"
REASON = re.compile(r"\b(longer than|over) \d[\d,]* lines\b", re.IGNORECASE)


def test_every_module_over_450_lines_says_why_it_is_one_piece_in_its_first_lines() -> None:
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text("utf-8").splitlines()
        if len(lines) > LIMIT and not REASON.search("\n".join(lines[:12])):
            unexplained.append(f"{path.relative_to(PACKAGE)} ({len(lines)} lines)")
    assert unexplained == []


def test_the_reason_is_found_where_the_modules_write_it() -> None:
    assert REASON.search('"""The server.\n\nLonger than 400 lines on purpose: one lifecycle.')
    assert REASON.search("(one module, a little over 400 lines, so that it reads as one page)")
    assert not REASON.search('"""The server: start, stop, and what is left behind."""')
