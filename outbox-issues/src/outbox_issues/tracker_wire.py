"""The tracker client's wire: one ``httpx`` client per tracker (no retries, no redirects),
one request and the failure it proves, the parsing of an answer into a model, a GraphQL
request, and the identity the token writes as. :mod:`.tracker_listings`,
:mod:`.tracker_rest` and :mod:`.tracker_graphql` build on it; :class:`~.tracker.GitHubTracker`
is all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from outbox_core.http_results import Proof
from outbox_core.http_settings import bearer

from .tracker_errors import (
    SECONDARY_LIMIT_MINIMUM,
    GraphQLRefused,
    NotSent,
    RateLimited,
    Refused,
    TrackerError,
    Unanswered,
    error_type,
    http_detail,
    rate_limit,
    until_reset,
)
from .tracker_models import User

if TYPE_CHECKING:
    import httpx

API_VERSION = "2022-11-28"
USER_AGENT = "outbox-issues"
_VIEWER = "query { viewer { login } }"

M = TypeVar("M", bound=BaseModel)


class TrackerWire:
    """The connection, the requests and the identity of one tracker and one token (see
    :class:`~.tracker.GitHubTracker`)."""

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
            **bearer(secret),
        }
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

    async def __aenter__(self) -> Self:
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
        if Proof.of_status(status) is Proof.UNANSWERED:  # a 5xx
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
            types = [error_type(e) for e in listed]
            messages = "; ".join(
                str(e.get("message", "")) if isinstance(e, dict) else str(e) for e in listed
            )
            if "RATE_LIMITED" in types:
                until = until_reset(response)
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
