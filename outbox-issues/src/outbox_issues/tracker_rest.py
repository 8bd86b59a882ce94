"""The REST calls of the tracker client: issues, issue and pull-request comments,
pull-request review comments (each kind's create, read, update, delete, listing and marker
search)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from .tracker_errors import Refused
from .tracker_listings import ListingReads
from .tracker_models import Comment, Found, Issue, ReviewComment


class RestCalls(ListingReads):
    """What the issue kinds and ``outbox-feedback`` call over REST."""

    # -- issues --------------------------------------------------------------------------------

    async def create_issue(
        self, repository: str, *, title: str, body: str, labels: Sequence[str] = ()
    ) -> Issue:
        response = await self.request(
            "POST",
            f"/repos/{repository}/issues",
            json={"title": title, "body": body, "labels": list(labels)},
        )
        return self._parse(Issue, response)

    async def get_issue(self, repository: str, number: int, *, follow_moved: bool = True) -> Issue:
        """One issue. A transferred issue's old URL answers 301: with ``follow_moved`` the
        issue is read once at the ``Location`` it names (a read is safe to repeat; nothing
        else follows a redirect), else :class:`Refused` with ``location``. A deleted issue
        answers 410."""
        try:
            response = await self.request("GET", f"/repos/{repository}/issues/{number}")
        except Refused as refused:
            if not (follow_moved and refused.status == 301 and refused.location):
                raise
            response = await self.request("GET", refused.location)
        return self._parse(Issue, response)

    async def update_issue(
        self,
        repository: str,
        number: int,
        *,
        title: str | None = None,
        body: str | None = None,
        labels: Sequence[str] | None = None,
        state: Literal["open", "closed"] | None = None,
    ) -> Issue:
        changes: dict[str, Any] = {}
        if title is not None:
            changes["title"] = title
        if body is not None:
            changes["body"] = body
        if labels is not None:
            changes["labels"] = list(labels)
        if state is not None:
            changes["state"] = state
        response = await self.request("PATCH", f"/repos/{repository}/issues/{number}", json=changes)
        return self._parse(Issue, response)

    @staticmethod
    def _issue_params(creator: str | None, since: datetime | None, per_page: int) -> dict[str, Any]:
        params: dict[str, Any] = {"state": "all", "per_page": per_page}
        if creator is not None:
            params["creator"] = creator
        if since is not None:
            params["since"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return params

    async def list_issues(
        self,
        repository: str,
        *,
        creator: str | None = None,
        since: datetime | None = None,
        per_page: int = 100,
        max_pages: int = 50,
    ) -> list[Issue]:
        """Every issue (``state=all``) created by ``creator`` and updated since ``since``,
        every page. Pull requests are listed too, as GitHub does (``pull_request`` set)."""
        params = self._issue_params(creator, since, per_page)
        return await self._list(Issue, f"/repos/{repository}/issues", params, max_pages)

    async def find_issue(
        self,
        repository: str,
        marker: str,
        *,
        since: datetime | None,
        per_page: int = 100,
        max_pages: int = 50,
    ) -> Found[Issue]:
        """The token's own issue whose body holds ``marker``, from the listing of the issues
        it created (``creator``: its identity; never the search API, which is eventually
        consistent). ``complete`` says whether every page was read."""
        params = self._issue_params(await self.identity(), since, per_page)
        return await self._find(Issue, f"/repos/{repository}/issues", params, marker, max_pages)

    # -- issue and pull-request comments -------------------------------------------------------

    async def create_comment(self, repository: str, number: int, body: str) -> Comment:
        """A comment on an issue or a pull request's conversation."""
        response = await self.request(
            "POST", f"/repos/{repository}/issues/{number}/comments", json={"body": body}
        )
        return self._parse(Comment, response)

    async def update_comment(self, repository: str, comment_id: int, body: str) -> Comment:
        response = await self.request(
            "PATCH", f"/repos/{repository}/issues/comments/{comment_id}", json={"body": body}
        )
        return self._parse(Comment, response)

    async def delete_comment(self, repository: str, comment_id: int) -> None:
        await self.request("DELETE", f"/repos/{repository}/issues/comments/{comment_id}")

    async def list_comments(
        self,
        repository: str,
        number: int,
        *,
        since: datetime | None = None,
        per_page: int = 100,
        max_pages: int = 50,
    ) -> list[Comment]:
        params: dict[str, Any] = {"per_page": per_page}
        if since is not None:
            params["since"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        url = f"/repos/{repository}/issues/{number}/comments"
        return await self._list(Comment, url, params, max_pages)

    async def find_comment(
        self, repository: str, number: int, marker: str, *, per_page: int = 100, max_pages: int = 50
    ) -> Found[Comment]:
        url = f"/repos/{repository}/issues/{number}/comments"
        return await self._find(Comment, url, {"per_page": per_page}, marker, max_pages)

    async def find_own_comments(
        self, repository: str, number: int, marker: str, *, per_page: int = 100, max_pages: int = 50
    ) -> Found[list[Comment]]:
        """Every comment of the token's identity on the issue that holds ``marker``."""
        url = f"/repos/{repository}/issues/{number}/comments"
        params = {"per_page": per_page}
        found = await self._scan(Comment, url, params, [marker], max_pages, every=True)
        return Found((found.item or {}).get(marker, []), found.complete, found.pages, found.foreign)

    async def find_comments(
        self,
        repository: str,
        number: int,
        markers: Sequence[str],
        *,
        per_page: int = 100,
        max_pages: int = 50,
    ) -> Found[dict[str, Comment]]:
        """The comments holding each of ``markers``, from one listing of the issue's (or pull
        request's conversation) comments; ``complete`` says whether every page was read."""
        url = f"/repos/{repository}/issues/{number}/comments"
        return await self._find_each(Comment, url, {"per_page": per_page}, markers, max_pages)

    # -- pull-request review comments ----------------------------------------------------------

    async def create_review_comment(
        self,
        repository: str,
        pull: int,
        body: str,
        *,
        commit_id: str,
        path: str,
        line: int,
        side: Literal["LEFT", "RIGHT"] = "RIGHT",
    ) -> ReviewComment:
        response = await self.request(
            "POST",
            f"/repos/{repository}/pulls/{pull}/comments",
            json={"body": body, "commit_id": commit_id, "path": path, "line": line, "side": side},
        )
        return self._parse(ReviewComment, response)

    async def update_review_comment(
        self, repository: str, comment_id: int, body: str
    ) -> ReviewComment:
        response = await self.request(
            "PATCH", f"/repos/{repository}/pulls/comments/{comment_id}", json={"body": body}
        )
        return self._parse(ReviewComment, response)

    async def delete_review_comment(self, repository: str, comment_id: int) -> None:
        await self.request("DELETE", f"/repos/{repository}/pulls/comments/{comment_id}")

    async def list_review_comments(
        self, repository: str, pull: int, *, per_page: int = 100, max_pages: int = 50
    ) -> list[ReviewComment]:
        url = f"/repos/{repository}/pulls/{pull}/comments"
        return await self._list(ReviewComment, url, {"per_page": per_page}, max_pages)

    async def find_review_comment(
        self, repository: str, pull: int, marker: str, *, per_page: int = 100, max_pages: int = 50
    ) -> Found[ReviewComment]:
        url = f"/repos/{repository}/pulls/{pull}/comments"
        return await self._find(ReviewComment, url, {"per_page": per_page}, marker, max_pages)

    async def find_review_comments(
        self,
        repository: str,
        pull: int,
        markers: Sequence[str],
        *,
        per_page: int = 100,
        max_pages: int = 50,
    ) -> Found[dict[str, ReviewComment]]:
        """The review comments holding each of ``markers``, from one listing of the pull
        request's review comments; ``complete`` says whether every page was read."""
        url = f"/repos/{repository}/pulls/{pull}/comments"
        return await self._find_each(ReviewComment, url, {"per_page": per_page}, markers, max_pages)
