"""The GraphQL calls of the tracker client: what a transfer and a delete need (REST has
neither). A transferred issue keeps its node id, so :meth:`GraphQLCalls.issue_by_node` reads
a transfer back."""

from __future__ import annotations

from typing import Any

from .tracker_errors import GraphQLRefused, Unanswered
from .tracker_models import IssueNode, Repository
from .tracker_wire import TrackerWire

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


class GraphQLCalls(TrackerWire):
    """Repositories and issues by node id, transfers and deletes."""

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
