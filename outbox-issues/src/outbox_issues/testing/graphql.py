"""GitHub's GraphQL (at ``/api/graphql``) as the loopback GitHub answers it: the node of an
issue, a repository's id, the token's ``viewer``, ``transferIssue`` and ``deleteIssue``
(refused the ways GitHub refuses it), with GraphQL's error shape at HTTP 200."""

from __future__ import annotations

from typing import Any

from outbox_core.testing.loopback_http import Answer

from .github_state import DOCS, DeleteRefusal, GitHubState, StoredIssue
from .rest import Handler

READS = frozenset({"graphql:node", "graphql:repository", "graphql:viewer"})
"""The GraphQL operations that only read (with every GET, what an outage makes unreadable)."""


class GraphQLAPI:
    """GraphQL over a :class:`~outbox_issues.testing.github_state.GitHubState`."""

    def __init__(self, state: GitHubState) -> None:
        self.state = state

    def route(self, payload: Any) -> tuple[str, Handler]:
        """The operation of a GraphQL request (``graphql:<field>``) and what answers it."""
        if not isinstance(payload, dict) or not isinstance(payload.get("query"), str):
            raise Answer(400, {"message": "Problems parsing JSON", "documentation_url": DOCS})
        text = payload["query"]
        variables = payload.get("variables") or {}
        for name, handler in (
            ("transferIssue", self._gql_transfer),
            ("deleteIssue", self._gql_delete),
            ("node(", self._gql_node),
            ("repository(", self._gql_repository),
            ("viewer", self._gql_viewer),
        ):
            if name in text:
                op = "graphql:" + name.rstrip("(")
                return op, lambda q, p, h=handler, v=variables, o=op: h(v, o)
        raise Answer(200, {"errors": [{"type": "INTERNAL", "message": "unsupported query"}]})

    def _by_node(self, node_id: Any) -> StoredIssue | None:
        for issue in self.state.issues.values():
            if issue.node_id == node_id and not issue.deleted and not issue.pull:
                return issue
        return None

    @staticmethod
    def _not_found(path: str, what: str) -> tuple[int, Any, dict[str, str]]:
        return (
            200,
            {
                "data": {path: None},
                "errors": [
                    {
                        "type": "NOT_FOUND",
                        "path": [path],
                        "locations": [{"line": 1, "column": 1}],
                        "message": what,
                    }
                ],
            },
            {},
        )

    def _gql_node(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        issue = self._by_node(variables.get("id"))
        if issue is None:
            return self._not_found(
                "node",
                f"Could not resolve to a node with the global id of '{variables.get('id')}'.",
            )
        return 200, {"data": {"node": self.state.node_json(issue)}}, {}

    def _gql_viewer(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        """The token's account, a user's or an App installation's bot (``<slug>[bot]``)."""
        return 200, {"data": {"viewer": {"login": self.state.login}}}, {}

    def _gql_repository(
        self, variables: dict[str, Any], op: str
    ) -> tuple[int, Any, dict[str, str]]:
        name = f"{variables.get('owner')}/{variables.get('name')}"
        repo = self.state.repositories.get(name)
        if repo is None or repo.gone:
            return self._not_found(
                "repository", f"Could not resolve to a Repository with the name '{name}'."
            )
        return 200, {"data": {"repository": {"id": repo.node_id, "nameWithOwner": name}}}, {}

    def _gql_transfer(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        issue = self._by_node(variables.get("issue"))
        target = next(
            (
                r
                for r in server.repositories.values()
                if r.node_id == variables.get("repository") and not r.gone
            ),
            None,
        )
        if issue is None or target is None:
            return self._not_found("transferIssue", "Could not resolve to a node.")
        if issue.repository == target.name:
            return (
                200,
                {
                    "data": {"transferIssue": None},
                    "errors": [
                        {
                            "type": "UNPROCESSABLE",
                            "path": ["transferIssue"],
                            "message": "The issue is already in this repository.",
                        }
                    ],
                },
                {},
            )
        old = f"{issue.repository}#{issue.number}"
        server.move_issue(issue.repository, issue.number, target.name)
        server.record(op, old, None)
        return 200, {"data": {"transferIssue": {"issue": server.node_json(issue)}}}, {}

    def _gql_delete(self, variables: dict[str, Any], op: str) -> tuple[int, Any, dict[str, str]]:
        server = self.state
        if server.deletes_refused is not None:
            return _refused_delete(server.deletes_refused, server.login)
        issue = self._by_node(variables.get("issue"))
        if issue is None:
            return self._not_found("deleteIssue", "Could not resolve to a node.")
        issue.deleted = True
        server.record(op, f"{issue.repository}#{issue.number}", None)
        return 200, {"data": {"deleteIssue": {"clientMutationId": None}}}, {}


def _refused_delete(how: DeleteRefusal, login: str) -> tuple[int, Any, dict[str, str]]:
    """GitHub's answer to a ``deleteIssue`` it refuses (see ``refuse_deletes``)."""
    where = [{"line": 1, "column": 25}]
    if how == "not_found":
        return 404, {"message": "Not Found", "documentation_url": DOCS}, {}
    if how == "missing":
        error = {
            "path": ["mutation", "deleteIssue"],
            "extensions": {
                "code": "undefinedField",
                "typeName": "Mutation",
                "fieldName": "deleteIssue",
            },
            "locations": where,
            "message": "Field 'deleteIssue' doesn't exist on type 'Mutation'",
        }
        return 200, {"errors": [error]}, {}
    error = {
        "type": "FORBIDDEN",
        "path": ["deleteIssue"],
        "extensions": {"saml_failure": False},
        "locations": where,
        "message": f"{login} does not have the correct permissions to execute `DeleteIssue`",
    }
    return 200, {"data": {"deleteIssue": None}, "errors": [error]}, {}
