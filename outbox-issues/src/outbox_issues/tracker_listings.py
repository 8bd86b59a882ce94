"""Listings and marker read-backs of the tracker client: pages followed by their ``Link:
<...>; rel="next"`` header, and ``find_*``'s search for a marker in every page, taking only
what the token's identity wrote (an entry carrying the marker from anyone else is reported in
``Found.foreign``: markers are predictable, anyone who can comment can plant one)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from .tracker_errors import Unanswered
from .tracker_models import Found, same_login
from .tracker_wire import M, TrackerWire


class ListingReads(TrackerWire):
    """Listings page by page, and marker searches in them."""

    @staticmethod
    def _entry(model: type[M], entry: Any, url: str) -> M:
        try:
            return model.model_validate(entry)
        except ValidationError as exc:
            raise Unanswered(
                f"GET {url}: an entry that is not a {model.__name__}",
                detail=f"a listed entry that is not a {model.__name__}",
            ) from exc

    async def _walk(
        self, url: str, params: Mapping[str, Any], max_pages: int
    ) -> AsyncIterator[tuple[list[Any], bool]]:
        """Each page of a listing and whether it is the last, following ``Link: <...>;
        rel="next"``; stops after ``max_pages`` (the last one yielded then is not the last)."""
        response = await self.request("GET", url, params=params)
        for _ in range(max_pages):
            page = response.json()
            if not isinstance(page, list):
                raise Unanswered(
                    f"GET {url}: a listing that is not a JSON array",
                    detail="a listing that is not a JSON array",
                )
            following = response.links.get("next", {}).get("url")
            yield page, not following
            if not following:
                return
            response = await self.request("GET", following)

    async def pages(
        self, url: str, params: Mapping[str, Any], *, max_pages: int = 50
    ) -> AsyncIterator[list[Any]]:
        """Each page of a listing (at most ``max_pages``)."""
        async for page, _ in self._walk(url, params, max_pages):
            yield page

    async def _find(
        self,
        model: type[M],
        url: str,
        params: Mapping[str, Any],
        marker: str,
        max_pages: int,
    ) -> Found[M]:
        found = await self._find_each(model, url, params, [marker], max_pages)
        return Found((found.item or {}).get(marker), found.complete, found.pages, found.foreign)

    async def _find_each(
        self,
        model: type[M],
        url: str,
        params: Mapping[str, Any],
        wanted: Sequence[str],
        max_pages: int,
    ) -> Found[dict[str, M]]:
        """One listing read once for several markers: the first entry of the token's identity
        holding each marker (markers not found are missing from the mapping), and whether
        every page was read."""
        found = await self._scan(model, url, params, wanted, max_pages, every=False)
        first = {marker: items[0] for marker, items in (found.item or {}).items()}
        return Found(first, found.complete, found.pages, found.foreign)

    async def _scan(
        self,
        model: type[M],
        url: str,
        params: Mapping[str, Any],
        wanted: Sequence[str],
        max_pages: int,
        *,
        every: bool,
    ) -> Found[dict[str, list[M]]]:
        """The entries of the token's identity holding each wanted marker, page by page; the
        authors of entries holding one that someone else wrote are ``foreign``. Stops at the
        page where every marker was found, unless ``every`` entry is wanted."""
        mine = await self.identity()
        found: dict[str, list[M]] = {}
        foreign: list[tuple[str, str]] = []
        pages = 0
        async for page, last in self._walk(url, params, max_pages):
            pages += 1
            for entry in page:
                item = self._entry(model, entry, url)
                body = getattr(item, "body", None) or ""
                held = [marker for marker in wanted if marker in body]
                if not held:
                    continue
                author = getattr(getattr(item, "user", None), "login", None) or ""
                if not same_login(author, mine):
                    number = getattr(item, "number", None)
                    ref = f"#{number}" if number is not None else str(getattr(item, "id", ""))
                    foreign.append((author or "(unknown)", ref))
                    continue
                for marker in held:
                    found.setdefault(marker, []).append(item)
            if last or (not every and len(found) == len(wanted)):
                return Found(found, True, pages, tuple(foreign))
        return Found(found, False, pages, tuple(foreign))

    async def _list(
        self, model: type[M], url: str, params: Mapping[str, Any], max_pages: int
    ) -> list[M]:
        found: list[M] = []
        async for page in self.pages(url, params, max_pages=max_pages):
            found.extend(self._entry(model, entry, url) for entry in page)
        return found
