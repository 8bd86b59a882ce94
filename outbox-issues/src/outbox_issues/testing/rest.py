"""GitHub's REST API v3 (under ``/api/v3``) as the loopback GitHub answers it: ``GET /user``,
issues (created, listed with the ``creator``, ``state`` and ``since`` filters and ``Link``
pagination, read, edited), issue comments and pull-request review comments, with GitHub's
status codes and its 422 bodies (the limits of :mod:`outbox_issues.limits`, counted in code
points as GitHub counts them)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from outbox_core.testing.loopback_http import Answer

from ..limits import MAX_BODY, MAX_TITLE
from .github_state import DOCS, GitHubState, StoredComment, StoredIssue, error, now

Handler = Callable[[dict[str, str], Any], tuple[int, Any, dict[str, str]]]
"""What answers one request: (query, payload) to (status, body, headers), under the lock."""


def _blank(title: str) -> bool:
    """A title GitHub calls blank: nothing left without whitespace and format characters
    (U+FEFF, the zero-width ones)."""
    return not "".join(c for c in title if not c.isspace() and unicodedata.category(c) != "Cf")


def _too_long(resource: str, field_name: str, code: str, maximum: int) -> dict[str, str]:
    """One error of GitHub's 422 for a value over its limit, counted in characters (code
    points, as GitHub's Ruby counts them)."""
    name = "Body" if field_name == "data" else field_name
    return {
        "resource": resource,
        "code": code,
        "field": field_name,
        "message": f"{name} is too long (maximum is {maximum} characters)",
    }


def _comment_body(resource: str, payload: Any) -> str:
    """The body of a comment's create or edit, or GitHub's 422: missing, or over 65,536."""
    body = (payload or {}).get("body") if isinstance(payload, dict) else None
    if not isinstance(body, str) or not body:
        error = {"resource": resource, "code": "missing_field", "field": "body"}
    elif len(body) > MAX_BODY:
        # An issue comment's answer names the field "data" (as GitHub's does).
        field_name = "data" if resource == "IssueComment" else "body"
        code = "unprocessable" if resource == "IssueComment" else "custom"
        error = _too_long(resource, field_name, code, MAX_BODY)
    else:
        return body
    raise Answer(
        422, {"message": "Validation Failed", "errors": [error], "documentation_url": DOCS}
    )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class RestAPI:
    """The REST routes over a :class:`~outbox_issues.testing.github_state.GitHubState`."""

    def __init__(self, state: GitHubState) -> None:
        self.state = state

    def route(self, method: str, path: str) -> tuple[str, Handler]:
        """The operation of a REST request and what answers it; GitHub's 404 when no route
        (or no repository) matches."""
        server = self.state
        if not path.startswith("/api/v3/"):
            raise error(404, "Not Found")
        rest = path[len("/api/v3") :]
        if rest == "/user" and method == "GET":
            return "user", lambda q, p: self._user()
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)(/.*)", rest)
        if match is None:
            raise error(404, "Not Found")
        repository, tail = match.group(1), match.group(2)
        repo = server.repositories.get(repository)
        if repo is None or repo.gone:
            raise error(404, "Not Found")
        routes: list[tuple[str, str, str, Any]] = [
            ("POST", r"/issues", "create_issue", self._create_issue),
            ("GET", r"/issues", "list_issues", self._list_issues),
            ("GET", r"/issues/(\d+)", "get_issue", self._get_issue),
            ("PATCH", r"/issues/(\d+)", "update_issue", self._update_issue),
            ("POST", r"/issues/(\d+)/comments", "create_comment", self._create_comment),
            ("GET", r"/issues/(\d+)/comments", "list_comments", self._list_comments),
            ("PATCH", r"/issues/comments/(\d+)", "update_comment", self._update_comment),
            ("DELETE", r"/issues/comments/(\d+)", "delete_comment", self._delete_comment),
            ("POST", r"/pulls/(\d+)/comments", "create_review_comment", self._create_review),
            ("GET", r"/pulls/(\d+)/comments", "list_review_comments", self._list_reviews),
            ("PATCH", r"/pulls/comments/(\d+)", "update_review_comment", self._update_comment),
            ("DELETE", r"/pulls/comments/(\d+)", "delete_review_comment", self._delete_comment),
        ]
        for verb, pattern, op, handler in routes:
            found = re.fullmatch(pattern, tail)
            if verb == method and found is not None:
                ids = [int(group) for group in found.groups()]
                return op, lambda q, p, h=handler, r=repository, i=ids, o=op: h(r, i, q, p, o)
        raise error(404, "Not Found")

    def _user(self) -> tuple[int, Any, dict[str, str]]:
        """``GET /user``: the token's account; a GitHub App installation token (its login a
        bot's) is refused there, as GitHub refuses it."""
        login = self.state.login
        if login.endswith("[bot]"):
            raise Answer(
                403,
                {
                    "message": "Resource not accessible by integration",
                    "documentation_url": f"{DOCS}/users/users#get-the-authenticated-user",
                    "status": "403",
                },
            )
        return 200, self.state.user_json(login), {}

    def _issue(self, repository: str, number: int) -> StoredIssue:
        server = self.state
        moved = server.moved.get((repository, number))
        if moved is not None:
            target = f"{server.api_url}/repos/{moved[0]}/issues/{moved[1]}"
            raise Answer(
                301,
                {"message": "Moved Permanently", "url": target, "documentation_url": DOCS},
                {"location": target},
            )
        issue = server.issues.get((repository, number))
        if issue is None:
            raise error(404, "Not Found")
        if issue.deleted:
            raise error(410, "This issue was deleted")
        return issue

    @staticmethod
    def _validate(payload: Any, *, creating: bool) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise error(400, "Problems parsing JSON")
        errors = []
        title = payload.get("title")
        if (creating or "title" in payload) and (not isinstance(title, str) or _blank(title)):
            errors.append({"resource": "Issue", "code": "missing_field", "field": "title"})
        elif isinstance(title, str) and len(title) > MAX_TITLE:
            errors.append(_too_long("Issue", "title", "custom", MAX_TITLE))
        body = payload.get("body")
        if body is not None and (not isinstance(body, str) or len(body) > MAX_BODY):
            errors.append(_too_long("Issue", "body", "custom", MAX_BODY))
        labels = payload.get("labels")
        if labels is not None and not (
            isinstance(labels, list) and all(isinstance(label, str) for label in labels)
        ):
            errors.append({"resource": "Issue", "code": "invalid", "field": "labels"})
        if errors:
            raise Answer(
                422, {"message": "Validation Failed", "errors": errors, "documentation_url": DOCS}
            )
        return payload

    def _create_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        data = self._validate(payload, creating=True)
        issue = server._new_issue(
            repository,
            data["title"],
            data.get("body") or "",
            list(data.get("labels") or []),
            server.login,
        )
        server.record(op, f"{repository}#{issue.number}", issue.body)
        return 201, server.issue_json(issue), {"location": server.issue_json(issue)["url"]}

    def _list_issues(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        state = query.get("state", "open")
        if state not in ("open", "closed", "all"):
            raise Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [{"resource": "Issue", "code": "invalid", "field": "state"}],
                    "documentation_url": DOCS,
                },
            )
        since = None
        if "since" in query:
            try:
                since = datetime.fromisoformat(query["since"].replace("Z", "+00:00"))
            except ValueError:
                raise Answer(
                    422, {"message": "Validation Failed", "documentation_url": DOCS}
                ) from None
        creator = None if server.creator_ignored else query.get("creator")
        found = [
            issue
            for issue in server.issues.values()
            if issue.repository == repository
            and not issue.deleted
            and not issue.hidden
            and (state == "all" or issue.state == state)
            and (creator is None or issue.user == creator)
            and (since is None or issue.updated_at >= since)
        ]
        found.sort(key=lambda issue: issue.created_at, reverse=True)
        found.sort(key=lambda issue: issue.number, reverse=True)
        return self._page(found, query, server.issue_json, f"/repos/{repository}/issues")

    def _page(
        self, items: list[Any], query: dict[str, str], render: Any, path: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        per_page = max(1, min(100, int(query.get("per_page", 30))))
        page = max(1, int(query.get("page", 1)))
        last = max(1, -(-len(items) // per_page))
        chosen = items[(page - 1) * per_page : page * per_page]
        links = []

        def url(number: int) -> str:
            return f"{server.api_url}{path}?{urlencode({**query, 'page': number})}"

        if page < last:
            links += [f'<{url(page + 1)}>; rel="next"', f'<{url(last)}>; rel="last"']
        if page > 1:
            links += [f'<{url(1)}>; rel="first"', f'<{url(page - 1)}>; rel="prev"']
        headers = {"link": ", ".join(links)} if links else {}
        return 200, [render(item) for item in chosen], headers

    def _get_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        return 200, self.state.issue_json(self._issue(repository, ids[0])), {}

    def _update_issue(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        issue = self._issue(repository, ids[0])
        data = self._validate(payload, creating=False)
        if "body" in data and data["body"] != issue.body:
            issue.edits.append(issue.body)
            issue.body = data["body"] or ""
        if "title" in data:
            issue.title = data["title"]
        if "labels" in data:
            issue.labels = list(data["labels"])
        if data.get("state") in ("open", "closed"):
            issue.state = data["state"]
        issue.updated_at = now()
        server.record(op, f"{repository}#{issue.number}", data.get("body"))
        return 200, server.issue_json(issue), {}

    def _create_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        issue = self._issue(repository, ids[0])
        body = _comment_body("IssueComment", payload)
        comment = server._new_comment(repository, issue.number, body, server.login)
        issue.updated_at = now()
        server.record(op, f"{repository}#{issue.number}", body)
        return 201, server.comment_json(comment), {}

    def _list_comments(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        issue = self._issue(repository, ids[0])
        found = sorted(server.comments_on(repository, issue.number), key=lambda c: c.id)
        path = f"/repos/{repository}/issues/{issue.number}/comments"
        return self._page(found, query, server.comment_json, path)

    def _comment(self, repository: str, comment_id: int, review: bool) -> StoredComment:
        comment = self.state.comments.get(comment_id)
        if comment is None or comment.repository != repository or comment.review != review:
            raise error(404, "Not Found")
        return comment

    def _update_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        review = op.endswith("review_comment")
        comment = self._comment(repository, ids[0], review)
        body = _comment_body("PullRequestReviewComment" if review else "IssueComment", payload)
        comment.body = body
        comment.updated_at = now()
        server.record(op, f"comment {comment.id}", body)
        return 200, server.comment_json(comment), {}

    def _delete_comment(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        comment = self._comment(repository, ids[0], op.endswith("review_comment"))
        del server.comments[comment.id]
        server.record(op, f"comment {comment.id}", comment.body)
        return 204, None, {}

    def _pull(self, repository: str, number: int) -> StoredIssue:
        issue = self.state.issues.get((repository, number))
        if issue is None or not issue.pull:
            raise error(404, "Not Found")
        return issue

    def _create_review(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        pull = self._pull(repository, ids[0])
        data = payload if isinstance(payload, dict) else {}
        # GitHub takes `line` and `side` (LEFT or RIGHT); the deprecated `position` (an index
        # into the diff) stands in for them when given alone.
        required = ["body", "commit_id", "path"]
        if data.get("position") is None:
            required.append("line")
        missing = [name for name in required if not data.get(name)]
        invalid = [
            name
            for name, ok in (
                ("line", data.get("line") is None or _positive(data.get("line"))),
                ("side", data.get("side", "RIGHT") in ("LEFT", "RIGHT")),
                ("position", data.get("position") is None or _positive(data.get("position"))),
            )
            if not ok
        ]
        if invalid and not missing:
            raise Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [
                        {"resource": "PullRequestReviewComment", "code": "invalid", "field": name}
                        for name in invalid
                    ],
                    "documentation_url": DOCS,
                },
            )
        if not missing:
            _comment_body("PullRequestReviewComment", data)
        if missing:
            raise Answer(
                422,
                {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "resource": "PullRequestReviewComment",
                            "code": "missing_field",
                            "field": name,
                        }
                        for name in missing
                    ],
                    "documentation_url": DOCS,
                },
            )
        comment = server._new_comment(
            repository,
            pull.number,
            data["body"],
            server.login,
            review=True,
            path=data["path"],
            commit_id=data["commit_id"],
            line=data.get("line") or data.get("position"),
            side=data.get("side", "RIGHT"),
        )
        server.record(op, f"{repository}#{pull.number}", data["body"])
        return 201, server.comment_json(comment), {}

    def _list_reviews(
        self, repository: str, ids: list[int], query: dict[str, str], payload: Any, op: str
    ) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        pull = self._pull(repository, ids[0])
        found = server.review_comments_on(repository, pull.number)
        return self._page(
            found, query, server.comment_json, f"/repos/{repository}/pulls/{pull.number}/comments"
        )
