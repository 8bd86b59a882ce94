"""What an issue shows: its title, body and labels for one generation of a report, composed in
one place for the two who need it, the entry points (which refuse at enqueue what GitHub would
not take whole, :mod:`~outbox_issues.limits`) and the adapters (which write it).

The body holds the reporter's text whole, between the two markers a scrub looks for, then an
opaque reference to the report and the hidden markers. A draft's answer (outbox-draft), when
one was kept for the generation, stands before the text and gives the title; it is derived
text, so when the two together would pass GitHub's limit the draft is shortened to fit, with a
notice saying so, and the reporter's text (checked at enqueue to fit alone) is never cut.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import limits, markers
from .domain import file_key

DRAFT_SHORTENED = (
    "\n\n_(The draft was shortened to fit GitHub's limit of 65,536 characters; the report "
    "follows whole.)_"
)


def check_fits(
    report_id: str, title: str, text: str, generation: int, keys: tuple[str, ...]
) -> None:
    """Refuse (:class:`~outbox_core.InvalidRequest`) an issue GitHub would not take whole: the
    title (:func:`limits.check_title`) and the body as the kind writes it for ``generation``
    (the reporter's text whole with this package's markers; ``keys``, the extra action
    markers). Run by ``submit_report`` and ``edit_report`` on what they are about to store,
    and by the kinds' enqueue checks on a stored report."""
    limits.check_title("title", title)
    body = compose(report_id, title, text, generation, [], keys).body
    limits.check_body("text", body, "the issue's body")


@dataclass(frozen=True, slots=True)
class Content:
    title: str
    body: str
    labels: list[str]
    digest: str
    draft_cut: int = 0
    """How many characters of the draft's answer were left out to fit GitHub's limit."""


def compose(
    report_id: str,
    title: str,
    text: str,
    generation: int,
    labels: list[str],
    extra_keys: tuple[str, ...] = (),
    *,
    draft: tuple[str | None, str] | None = None,
) -> Content:
    """The issue of ``generation``: the report's ``title`` and ``text``, or with ``draft``
    (the answer's title and body kept for this generation) the draft's title and the draft
    before the text. The reporter's identity never appears: an opaque reference does."""
    if draft is None:
        return _compose(report_id, title, text, generation, labels, extra_keys)
    draft_title, answer = draft
    heading = draft_title if draft_title and limits.visible(draft_title) else title
    kept, notice = answer, ""
    while True:
        joined = f"{kept}{notice}\n\n---\n\n{text}"
        content = _compose(report_id, heading, joined, generation, labels, extra_keys)
        over = len(content.body) - limits.MAX_BODY
        if over <= 0:
            return replace(content, draft_cut=len(answer) - len(kept))
        if not kept:  # the report alone does not fit (stored before its limit was checked)
            return _compose(report_id, title, text, generation, labels, extra_keys)
        if not notice:
            notice = DRAFT_SHORTENED
            over += len(notice)
        kept = kept[: max(0, len(kept) - over)]


def _compose(
    report_id: str,
    title: str,
    text: str,
    generation: int,
    labels: list[str],
    extra_keys: tuple[str, ...],
) -> Content:
    title = " ".join(title.split())[: limits.MAX_TITLE]
    if not limits.visible(title):
        title = f"Feedback report {report_id}"
    visible = (
        f"{markers.reporter_section(text)}\n\n"
        f"<sub>Feedback report `{markers.inert_key(report_id)}`, generation {generation}</sub>\n"
    )
    keys = (file_key(report_id, 1), *extra_keys)
    hidden = "".join(f"{markers.action_marker(key)}\n" for key in keys)
    digest = markers.digest(title, visible + hidden, labels)
    body = visible + hidden + markers.content_marker(report_id, generation, digest) + "\n"
    return Content(title, body, labels, digest)
