"""``GitHubTracker``: an async client of the GitHub REST API v3 and the part of GraphQL that a
transfer and a delete need, over ``httpx``. The one tracker client of outbox: the issue kinds
use it, and so will ``outbox-feedback`` (issue and pull-request comments, review comments).

- The base URL is configurable: ``https://api.github.com``, or ``https://<host>/api/v3`` for
  GitHub Enterprise Server, whose GraphQL endpoint is ``https://<host>/api/graphql``.
- Listings follow the ``Link: <...>; rel="next"`` header page by page; ``find_*`` look for a
  marker in every page and say whether the listing was complete.
- A marker is read back only from what the token itself wrote: every ``find_*`` matches the
  entry's author (``user.login``) against :meth:`GitHubTracker.identity`, the identity the
  token writes as, found once per client and kept. An entry carrying the marker from anyone
  else is ignored and reported in ``Found.foreign`` (markers are predictable: anyone who can
  comment can plant one).
- Responses are typed (pydantic models that ignore fields they do not name).
- Failures are typed by what they prove (:class:`NotSent`, :class:`Unanswered`,
  :class:`RateLimited`, :class:`Refused`, :class:`GraphQLRefused`), so an adapter maps them
  to results in one place.
- The client never retries a request on its own, and follows no redirect: a write that an
  HTTP layer repeats could write twice, and a transferred issue's REST URL answers 301.

httpx is imported when a client is made, not when this module is imported.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from outbox_core import provider_clock, retry_after

if TYPE_CHECKING:
    import httpx

API_VERSION = "2022-11-28"
USER_AGENT = "outbox-issues"
SECONDARY_LIMIT_MINIMUM = 60.0
_SECONDARY_WORDS = ("secondary rate limit", "abuse detection")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


# -- responses -------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Model):
    login: str
    id: int | None = None
    type: str | None = None


class Label(_Model):
    name: str


class Issue(_Model):
    """An issue as ``/repos/{owner}/{repo}/issues`` returns it."""

    id: int
    node_id: str
    number: int
    title: str
    body: str | None = None
    state: str
    html_url: str
    url: str | None = None
    labels: list[Label] = []
    user: User | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    pull_request: dict[str, Any] | None = None

    @property
    def label_names(self) -> list[str]:
        return [label.name for label in self.labels]


class Comment(_Model):
    """An issue or pull-request conversation comment."""

    id: int
    node_id: str | None = None
    body: str | None = None
    html_url: str | None = None
    user: User | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ReviewComment(Comment):
    """A pull-request review comment (on a line of the diff)."""

    path: str | None = None
    commit_id: str | None = None
    line: int | None = None
    side: str | None = None
    pull_request_review_id: int | None = None


class Repository(_Model):
    name_with_owner: str
    node_id: str


class IssueNode(_Model):
    """An issue as GraphQL returns it: its node id stays the same across a transfer."""

    id: str
    number: int
    url: str
    repository: str
    """``owner/name`` of the repository that holds it now."""


@dataclass(frozen=True, slots=True)
class Found(Generic[T]):
    """What a marker search found (``item`` None: not there), and whether the listing was
    complete: every page was read. Absence proves nothing when it was not. ``foreign`` holds
    (author, ref) of each listed entry that carried a wanted marker but was not written by
    the token's identity (ref: ``#<number>`` of an issue, the id of a comment): ignored,
    never taken for ours."""

    item: T | None
    complete: bool
    pages: int
    foreign: tuple[tuple[str, str], ...] = ()


# -- failures --------------------------------------------------------------------------------


class TrackerError(Exception):
    """A request to the tracker that did not succeed. ``detail`` is what the action keeps of
    it (outbox_core.results): the HTTP status and the tracker's own words about the failure
    (``"HTTP 422 Validation Failed"``), never a URL, the issue's content or a token; the
    message, for logs, names the request."""

    def __init__(
        self, message: str, *, status: int | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or (f"HTTP {status}" if status is not None else type(self).__name__)


# What a detail keeps of the tracker's message: its first sentence, without anything that may
# name a person, a place or a secret (an address, a URL or path, an IP, a long number: "API
# rate limit exceeded for user ID 1234").
_UNSAFE = re.compile(r"\S*[@/\\:]\S*|\d+(?:\.\d+){3}|\d{4,}")
# A GraphQL error's type (NOT_FOUND), or its extensions' code when it has none
# (undefinedField: a schema without the field asked for).
_GRAPHQL_TYPE = re.compile(r"[A-Za-z][A-Za-z_]{0,40}")


def said(message: str) -> str:
    """The tracker's words as a detail keeps them (see ``_UNSAFE``), at most 80 characters."""
    first = message.strip().split(". ")[0].rstrip(".")
    return " ".join(_UNSAFE.sub("\u2026", first).split())[:80]


def http_detail(status: int, message: str) -> str:
    """``"HTTP 404 Not Found"``: the status and the tracker's words (``said``)."""
    words = said(message)
    return f"HTTP {status} {words}" if words else f"HTTP {status}"


class NotSent(TrackerError):
    """The request never reached the tracker (connection refused, connect timeout, no pool
    slot): it holds nothing from it."""


class Unanswered(TrackerError):
    """The request was sent and no usable answer came back (a timeout, a dropped connection,
    a 5xx): it may have taken effect."""


class RateLimited(TrackerError):
    """A primary limit (``x-ratelimit-remaining: 0``, wait until ``x-ratelimit-reset``) or a
    secondary one (its message says so; ``retry-after``, or at least a minute). Nothing was
    written."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        wait_seconds: float,
        secondary: bool,
        detail: str | None = None,
    ) -> None:
        which = "secondary" if secondary else "primary"
        super().__init__(
            message, status=status, detail=detail or f"HTTP {status} {which} rate limit"
        )
        self.wait_seconds = wait_seconds
        self.secondary = secondary


class Refused(TrackerError):
    """A 4xx that is not a rate limit: the tracker refused the request (401, 403, 404, 410,
    422 ...). ``errors`` holds a 422's validation errors."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        errors: Sequence[Any] = (),
        documentation_url: str | None = None,
        location: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, status=status, detail=detail)
        self.errors = list(errors)
        self.documentation_url = documentation_url
        self.location = location


class GraphQLRefused(TrackerError):
    """GraphQL answered (HTTP 200) with ``errors``; ``types`` holds their ``type`` fields
    (``NOT_FOUND``, ``FORBIDDEN``, ...), or the ``extensions.code`` of one without a type
    (``undefinedField``). ``RATE_LIMITED`` raises :class:`RateLimited`."""

    def __init__(self, message: str, *, types: Sequence[str]) -> None:
        named = [kind for kind in types if _GRAPHQL_TYPE.fullmatch(kind)]
        super().__init__(
            message, status=200, detail=f"GraphQL {', '.join(named) if named else 'errors'}"
        )
        self.types = list(types)


def _error_type(error: Any) -> str:
    """A GraphQL error's ``type``, else its ``extensions.code`` (GitHub's schema errors, such
    as ``undefinedField``, carry no type), else ""."""
    if not isinstance(error, dict):
        return ""
    extensions = error.get("extensions")
    code = extensions.get("code") if isinstance(extensions, dict) else None
    return str(error.get("type") or code or "")


def _until_reset(response: httpx.Response) -> float | None:
    """Seconds until ``x-ratelimit-reset`` (a Unix time), read against the tracker's clock
    (its ``Date`` header), not this host's; None without a readable header."""
    try:
        reset = float(response.headers.get("x-ratelimit-reset", ""))
    except ValueError:
        return None
    return reset - provider_clock(response.headers.get("date"))


def rate_limit(response: httpx.Response, message: str) -> RateLimited | None:
    """The rate limit a 403 or 429 reports, or None when it reports none.

    Every REST answer carries ``x-ratelimit-*`` headers, so their presence proves nothing:
    a primary limit says ``x-ratelimit-remaining: 0``; a secondary one says so in its message
    (``You have exceeded a secondary rate limit``) or sends ``retry-after``."""
    status = response.status_code
    if status not in (403, 429):
        return None
    headers = response.headers
    asked = retry_after(headers.get("retry-after"), date=headers.get("date"))
    retry_after_seconds = None if asked is None else asked.total_seconds()
    if headers.get("x-ratelimit-remaining") == "0":
        until = _until_reset(response)
        wait = until if until is not None else SECONDARY_LIMIT_MINIMUM
        if retry_after_seconds is not None:
            wait = max(wait, retry_after_seconds)
        return RateLimited(
            f"primary rate limit ({headers.get('x-ratelimit-resource', 'core')}): {message}",
            status=status,
            wait_seconds=max(1.0, wait + 1.0),
            secondary=False,
        )
    lowered = message.lower()
    if retry_after_seconds is not None or any(words in lowered for words in _SECONDARY_WORDS):
        wait = retry_after_seconds if retry_after_seconds is not None else SECONDARY_LIMIT_MINIMUM
        return RateLimited(
            f"secondary rate limit: {message}",
            status=status,
            wait_seconds=max(1.0, wait),
            secondary=True,
        )
    if status == 429:
        return RateLimited(
            f"429 without limit headers: {message}",
            status=status,
            wait_seconds=SECONDARY_LIMIT_MINIMUM,
            secondary=True,
        )
    return None


# -- the client ------------------------------------------------------------------------------

_REPOSITORY = (
    "query($owner: String!, $name: String!) "
    "{ repository(owner: $owner, name: $name) { id nameWithOwner } }"
)
_ISSUE_FIELDS = "id number url repository { nameWithOwner }"
_NODE = f"query($id: ID!) {{ node(id: $id) {{ ... on Issue {{ {_ISSUE_FIELDS} }} }} }}"
_TRANSFER = (
    "mutation($issue: ID!, $repository: ID!) { transferIssue(input: {issueId: $issue, "
    "repositoryId: $repository, createLabelsIfMissing: true}) "
    f"{{ issue {{ {_ISSUE_FIELDS} }} }} }}"
)
_DELETE = "mutation($issue: ID!) { deleteIssue(input: {issueId: $issue}) { clientMutationId } }"
_VIEWER = "query { viewer { login } }"


def same_login(one: str, other: str) -> bool:
    """GitHub logins are case-insensitive (the API answers with the account's own case, a
    setting may be typed otherwise)."""
    return one.casefold() == other.casefold()


class GitHubTracker:
    """One tracker, one token. Use ``async with`` or call :meth:`aclose`.

    ``transport`` replaces the network (tests); the client never retries and never follows
    redirects, whatever transport it is given. ``identity`` is the login the token writes as
    when the settings say it (``OUTBOX_ISSUES_WRITER_LOGIN``, or ``<slug>[bot]`` for
    ``OUTBOX_ISSUES_APP_SLUG``); unset, :meth:`identity` asks the tracker once."""

    def __init__(
        self,
        api_url: str,
        token: SecretStr | str | None,
        *,
        identity: str | None = None,
        graphql_url: str | None = None,
        connect_timeout: float = 5.0,
        timeout: float = 20.0,
        max_connections: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx

        from .settings import graphql_url_for

        self.api_url = api_url.rstrip("/")
        self.graphql_url = graphql_url or graphql_url_for(self.api_url)
        self._identity = identity
        self._identity_asked = asyncio.Lock()
        secret = token if isinstance(token, SecretStr) or token is None else SecretStr(token)
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": USER_AGENT,
        }
        if secret is not None:
            headers["Authorization"] = f"Bearer {secret.get_secret_value()}"
        if getattr(getattr(transport, "_pool", None), "_retries", 0):
            from outbox_core import ConfigurationError

            raise ConfigurationError(
                "GitHubTracker: the transport retries requests on its own, which could send a "
                "write twice; build it with retries=0"
            )
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout, pool=connect_timeout),
            follow_redirects=False,
            # retries=0: httpcore would otherwise open a new connection and send the request
            # again after a failed connect, which for a write is a second write.
            transport=transport
            if transport is not None
            else httpx.AsyncHTTPTransport(retries=0, limits=limits),
        )

    async def __aenter__(self) -> GitHubTracker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the wire ------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """One request; a 2xx answer, or the failure it proves raised as a TrackerError."""
        import httpx

        target = url if url.startswith(("http://", "https://")) else f"{self.api_url}{url}"
        try:
            response = await self._http.request(method, target, json=json, params=params)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise NotSent(
                f"{method} {url}: {type(exc).__name__}: {exc}",
                detail=f"{type(exc).__name__} before the request was sent",
            ) from exc
        except httpx.TransportError as exc:
            raise Unanswered(
                f"{method} {url}: {type(exc).__name__}: {exc}",
                detail=f"{type(exc).__name__} after the request was sent",
            ) from exc
        if response.is_success:
            return response
        raise self._failure(method, url, response)

    def _failure(self, method: str, url: str, response: httpx.Response) -> TrackerError:
        status = response.status_code
        message, documentation = "", None
        errors: Any = []
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            message = str(body.get("message", ""))
            errors = body.get("errors") or []
            documentation = body.get("documentation_url")
        if not message:
            message = response.reason_phrase or f"HTTP {status}"
        what = f"{method} {url} answered {status}: {message}"
        limited = rate_limit(response, message)
        if limited is not None:
            return limited
        if status >= 500:
            return Unanswered(what, status=status, detail=http_detail(status, message))
        return Refused(
            what,
            status=status,
            detail=http_detail(status, message),
            errors=errors if isinstance(errors, list) else [errors],
            documentation_url=documentation,
            location=response.headers.get("location"),
        )

    @staticmethod
    def _parse(model: type[M], response: httpx.Response) -> M:
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError) as exc:
            # A 2xx that is not what the API documents: the write may have happened.
            raise Unanswered(
                f"{response.request.method} {response.request.url.path}: a {response.status_code} "
                f"whose body is not a {model.__name__} ({type(exc).__name__})",
                status=response.status_code,
                detail=f"HTTP {response.status_code} with a body that is not a {model.__name__}",
            ) from exc

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

    # -- identity ------------------------------------------------------------------------------

    async def identity(self) -> str:
        """The login the token writes as: what every marker read-back matches an entry's
        author against. Given by the settings, or asked once per client and kept:

        - a user's token (a personal access token, an OAuth token): ``GET /user``'s login;
        - a GitHub App installation token, which ``GET /user`` refuses (403 "Resource not
          accessible by integration"): GraphQL's ``viewer``, the App's bot (``<slug>[bot]``,
          the author of everything the installation writes)."""
        if self._identity is None:
            async with self._identity_asked:
                if self._identity is None:
                    self._identity = await self._ask_identity()
        return self._identity

    async def _ask_identity(self) -> str:
        try:
            return self._parse(User, await self.request("GET", "/user")).login
        except Refused as refused:
            if refused.status != 403:
                raise
        viewer = (await self.graphql(_VIEWER, {})).get("viewer")
        login = viewer.get("login") if isinstance(viewer, dict) else None
        if not isinstance(login, str) or not login:
            raise Unanswered(
                "GraphQL viewer answered without a login", detail="GraphQL viewer without a login"
            )
        return login

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

    # -- GraphQL -------------------------------------------------------------------------------

    async def graphql(self, query: str, variables: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` of one GraphQL request. GraphQL reports its failures as HTTP 200 with an
        ``errors`` array: ``RATE_LIMITED`` raises :class:`RateLimited`, any other
        :class:`GraphQLRefused` naming the types; never a success."""
        response = await self.request(
            "POST", self.graphql_url, json={"query": query, "variables": dict(variables)}
        )
        try:
            answer = response.json()
        except ValueError as exc:
            raise Unanswered(
                "GraphQL: a 200 whose body is not JSON",
                detail="GraphQL: a 200 whose body is not JSON",
            ) from exc
        if not isinstance(answer, dict):
            raise Unanswered(
                "GraphQL: a 200 whose body is not an object",
                detail="GraphQL: a 200 whose body is not an object",
            )
        errors = answer.get("errors")
        if errors:
            listed = errors if isinstance(errors, list) else [errors]
            types = [_error_type(e) for e in listed]
            messages = "; ".join(
                str(e.get("message", "")) if isinstance(e, dict) else str(e) for e in listed
            )
            if "RATE_LIMITED" in types:
                until = _until_reset(response)
                wait = until + 1.0 if until is not None else SECONDARY_LIMIT_MINIMUM
                raise RateLimited(
                    f"GraphQL RATE_LIMITED: {messages}",
                    status=200,
                    wait_seconds=max(1.0, wait),
                    secondary=False,
                    detail="GraphQL RATE_LIMITED",
                )
            raise GraphQLRefused(f"GraphQL errors ({', '.join(types)}): {messages}", types=types)
        data = answer.get("data")
        if not isinstance(data, dict):
            raise Unanswered(
                "GraphQL: an answer without data or errors",
                detail="GraphQL: an answer without data or errors",
            )
        return data

    async def repository(self, repository: str) -> Repository:
        owner, name = repository.split("/", 1)
        data = await self.graphql(_REPOSITORY, {"owner": owner, "name": name})
        found = data.get("repository")
        if not isinstance(found, dict):
            raise GraphQLRefused(f"no repository {repository}", types=["NOT_FOUND"])
        return Repository(name_with_owner=found["nameWithOwner"], node_id=found["id"])

    @staticmethod
    def _node(found: Any) -> IssueNode:
        return IssueNode(
            id=found["id"],
            number=found["number"],
            url=found["url"],
            repository=found["repository"]["nameWithOwner"],
        )

    async def issue_by_node(self, node_id: str) -> IssueNode | None:
        """The issue with this node id wherever it is now; None when it does not exist (any
        more). A transfer keeps the node id, so this reads a transfer back."""
        try:
            data = await self.graphql(_NODE, {"id": node_id})
        except GraphQLRefused as exc:
            if exc.types and all(kind == "NOT_FOUND" for kind in exc.types):
                return None
            raise
        found = data.get("node")
        if not isinstance(found, dict) or "number" not in found:
            return None
        return self._node(found)

    async def transfer_issue(self, node_id: str, repository_node_id: str) -> IssueNode:
        data = await self.graphql(_TRANSFER, {"issue": node_id, "repository": repository_node_id})
        moved = (data.get("transferIssue") or {}).get("issue")
        if not isinstance(moved, dict):
            raise Unanswered(
                "GraphQL transferIssue answered without the issue",
                detail="GraphQL transferIssue answered without the issue",
            )
        return self._node(moved)

    async def delete_issue(self, node_id: str) -> None:
        """Delete an issue for good (GraphQL ``deleteIssue``; admin rights on the repository)."""
        await self.graphql(_DELETE, {"issue": node_id})
