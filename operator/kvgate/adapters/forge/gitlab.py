"""GitLab: merge requests through its REST API (v4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvgate.adapters.forge.base import (
    PullRequest,
    PullRequestState,
    RestForge,
    b64,
    decode_content,
    quote_part,
)
from kvgate.errors import ForgeAccessError

# --- GitLab ---------------------------------------------------------------------------------

_GITLAB_DEVELOPER: Final = 30  # the access level that may push to unprotected branches


class GitLabForge(RestForge):
    """GitLab, `api_url` like `https://gitlab.com/api/v4`; `repo` is the project path."""

    name = "gitlab"

    def _headers(self) -> dict[str, str]:
        return {"PRIVATE-TOKEN": self._token, "Accept": "application/json"}

    def _project(self, repo: str) -> str:
        return "/projects/" + quote_part(repo)

    def _check_write_access(self, repo: str) -> None:
        data = self._call(
            "GET", self._project(repo), repo, "reading the project", permission="read the project"
        )
        levels = [0]
        for key in ("project_access", "group_access"):
            access = (data.get("permissions") or {}).get(key) if isinstance(data, Mapping) else None
            if isinstance(access, Mapping) and isinstance(access.get("access_level"), int):
                levels.append(access["access_level"])
        if max(levels) < _GITLAB_DEVELOPER:
            raise ForgeAccessError(
                repo,
                f"the token's user has access level {max(levels)}; committing on a "
                f"kvgate/ branch needs Developer ({_GITLAB_DEVELOPER}) or above",
            )

    def _branch_head(self, repo: str, branch: str) -> str | None:
        data = self._call(
            "GET",
            f"{self._project(repo)}/repository/branches/{quote_part(branch)}",
            repo,
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(data["commit"]["id"])

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        data = self._call(
            "GET",
            f"{self._project(repo)}/repository/files/{quote_part(path)}",
            repo,
            f"reading {path} on {branch}",
            permission="read the repository",
            ok404=True,
            params={"ref": branch},
        )
        if data is None:
            return None, None
        return decode_content(data.get("content", ""), path, repo), str(data.get("blob_id", ""))

    def _commit(
        self,
        repo: str,
        branch: str,
        start_from: str | None,
        changes: Mapping[str, tuple[bytes, str | None]],
        message: str,
    ) -> None:
        actions = [
            {
                "action": "create" if sha is None else "update",
                "file_path": path,
                "content": b64(data),
                "encoding": "base64",
            }
            for path, (data, sha) in changes.items()
        ]
        payload: dict[str, Any] = {"branch": branch, "commit_message": message, "actions": actions}
        if start_from is not None:
            payload["start_branch"] = start_from
        self._call(
            "POST",
            f"{self._project(repo)}/repository/commits",
            repo,
            f"committing on {branch}",
            permission="push to the repository (Developer)",
            json=payload,
        )

    def _find_open(self, repo: str, base: str, branch: str) -> tuple[int, str, str] | None:
        items = self._call(
            "GET",
            f"{self._project(repo)}/merge_requests",
            repo,
            "listing merge requests",
            permission="read merge requests",
            params={"state": "opened", "source_branch": branch, "target_branch": base},
        )
        for mr in items or []:  # the filter is checked again: old GitLabs ignored it
            if mr["source_branch"] == branch and mr["target_branch"] == base:
                return int(mr["iid"]), str(mr["title"]), str(mr.get("description") or "")
        return None

    def _create(self, repo: str, base: str, branch: str, title: str, body: str) -> PullRequest:
        data = self._call(
            "POST",
            f"{self._project(repo)}/merge_requests",
            repo,
            "opening a merge request",
            permission="open merge requests",
            json={
                "source_branch": branch,
                "target_branch": base,
                "title": title,
                "description": body,
            },
        )
        return _gitlab_mr(data)

    def _edit(self, repo: str, number: int, title: str, body: str) -> None:
        self._call(
            "PUT",
            f"{self._project(repo)}/merge_requests/{number}",
            repo,
            f"editing merge request !{number}",
            permission="edit merge requests",
            json={"title": title, "description": body},
        )

    def _state(self, repo: str, number: int) -> PullRequest:
        data = self._call(
            "GET",
            f"{self._project(repo)}/merge_requests/{int(number)}",
            repo,
            f"reading merge request !{number}",
            permission="read merge requests",
        )
        return _gitlab_mr(data)

    def _close(self, repo: str, number: int, comment: str) -> None:
        self._call(
            "POST",
            f"{self._project(repo)}/merge_requests/{int(number)}/notes",
            repo,
            f"commenting on merge request !{number}",
            permission="comment on merge requests",
            json={"body": comment},
        )
        self._call(
            "PUT",
            f"{self._project(repo)}/merge_requests/{int(number)}",
            repo,
            f"closing merge request !{number}",
            permission="edit merge requests",
            json={"state_event": "close"},
        )


def _gitlab_mr(data: Mapping[str, Any]) -> PullRequest:
    state = {"merged": PullRequestState.MERGED, "closed": PullRequestState.CLOSED}.get(
        str(data.get("state")), PullRequestState.OPEN
    )
    sha = data.get("merge_commit_sha") or data.get("squash_commit_sha")
    merged_sha = str(sha) if state is PullRequestState.MERGED and sha else None
    return PullRequest(
        int(data["iid"]),
        str(data.get("web_url", "")),
        state,
        merged_sha,
        branch=str(data["source_branch"]),
    )
