"""Gitea and GitHub: one pull-request JSON, two ways to commit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.adapters.forge.base import (
    MAX_PAGES,
    PullRequest,
    PullRequestState,
    RestForge,
    b64,
    decode_content,
    quote_part,
    quote_path,
)
from kvgate.errors import ForgeAccessError, ForgeError

# --- Gitea ----------------------------------------------------------------------------------


class GiteaForge(RestForge):
    """Gitea (and its API-compatible forks), `api_url` like `https://git.example/api/v1`."""

    name = "gitea"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}", "Accept": "application/json"}

    def _repo(self, repo: str) -> str:
        return "/repos/" + "/".join(quote_part(p) for p in repo.split("/", 1))

    def _check_write_access(self, repo: str) -> None:
        data = self._call(
            "GET",
            self._repo(repo),
            repo,
            "reading the repository",
            permission="read the repository",
        )
        permissions = data.get("permissions") if isinstance(data, Mapping) else None
        if not (isinstance(permissions, Mapping) and permissions.get("push")):
            raise ForgeAccessError(
                repo,
                "the token's user may read but not push (write access to the "
                "repository's code is needed to commit on a kvgate/ branch)",
            )

    def _branch_head(self, repo: str, branch: str) -> str | None:
        data = self._call(
            "GET",
            f"{self._repo(repo)}/branches/{quote_path(branch)}",
            repo,
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(data["commit"]["id"])

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        data = self._call(
            "GET",
            f"{self._repo(repo)}/contents/{quote_path(path)}",
            repo,
            f"reading {path} on {branch}",
            permission="read the repository",
            ok404=True,
            params={"ref": branch},
        )
        if data is None:
            return None, None
        if not isinstance(data, Mapping) or data.get("type") != "file":
            raise ForgeError(repo, f"{path} on {branch} is not a file")
        return decode_content(data.get("content", ""), path, repo), str(data["sha"])

    def _commit(
        self,
        repo: str,
        branch: str,
        start_from: str | None,
        changes: Mapping[str, tuple[bytes, str | None]],
        message: str,
    ) -> None:
        files = [
            {"operation": "create", "path": path, "content": b64(data)}
            if sha is None
            else {"operation": "update", "path": path, "content": b64(data), "sha": sha}
            for path, (data, sha) in changes.items()
        ]
        target = {"branch": start_from, "new_branch": branch} if start_from else {"branch": branch}
        self._call(
            "POST",
            f"{self._repo(repo)}/contents",
            repo,
            f"committing on {branch}",
            permission="write the repository's code",
            json={"message": message, "files": files, **target},
        )

    def _find_open(self, repo: str, base: str, branch: str) -> tuple[int, str, str] | None:
        for page in range(1, MAX_PAGES + 1):
            items = self._call(
                "GET",
                f"{self._repo(repo)}/pulls",
                repo,
                "listing pull requests",
                permission="read pull requests",
                params={"state": "open", "limit": 50, "page": page},
            )
            for pr in items or []:
                if pr["head"]["ref"] == branch and pr["base"]["ref"] == base:
                    return int(pr["number"]), str(pr["title"]), str(pr.get("body") or "")
            if not items or len(items) < 50:
                return None
        return None

    def _create(self, repo: str, base: str, branch: str, title: str, body: str) -> PullRequest:
        data = self._call(
            "POST",
            f"{self._repo(repo)}/pulls",
            repo,
            "opening a pull request",
            permission="open pull requests",
            json={"head": branch, "base": base, "title": title, "body": body},
        )
        return gitea_pull_request(data)

    def _edit(self, repo: str, number: int, title: str, body: str) -> None:
        self._call(
            "PATCH",
            f"{self._repo(repo)}/pulls/{number}",
            repo,
            f"editing pull request #{number}",
            permission="edit pull requests",
            json={"title": title, "body": body},
        )

    def _state(self, repo: str, number: int) -> PullRequest:
        data = self._call(
            "GET",
            f"{self._repo(repo)}/pulls/{int(number)}",
            repo,
            f"reading pull request #{number}",
            permission="read pull requests",
        )
        return gitea_pull_request(data)

    def _close(self, repo: str, number: int, comment: str) -> None:
        self._call(
            "POST",
            f"{self._repo(repo)}/issues/{int(number)}/comments",
            repo,
            f"commenting on pull request #{number}",
            permission="comment on pull requests",
            json={"body": comment},
        )
        self._call(
            "PATCH",
            f"{self._repo(repo)}/pulls/{int(number)}",
            repo,
            f"closing pull request #{number}",
            permission="edit pull requests",
            json={"state": "closed"},
        )


def gitea_pull_request(data: Mapping[str, Any]) -> PullRequest:
    """Gitea's and GitHub's pull request JSON have the same fields for this."""
    merged = bool(data.get("merged"))
    if merged:
        state = PullRequestState.MERGED
    elif data.get("state") == "closed":
        state = PullRequestState.CLOSED
    else:
        state = PullRequestState.OPEN
    sha = data.get("merge_commit_sha") if merged else None  # GitHub sets a test merge too
    return PullRequest(
        int(data["number"]),
        str(data.get("html_url", "")),
        state,
        str(sha) if sha else None,
        branch=str(data["head"]["ref"]),
    )


# --- GitHub ---------------------------------------------------------------------------------


class GitHubForge(GiteaForge):
    """GitHub and GitHub Enterprise, `api_url` like `https://api.github.com`."""

    name = "github"

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }

    def _branch_head(self, repo: str, branch: str) -> str | None:
        data = self._call(
            "GET",
            f"{self._repo(repo)}/git/ref/heads/{quote_path(branch)}",
            repo,
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(data["object"]["sha"])

    def _commit(
        self,
        repo: str,
        branch: str,
        start_from: str | None,
        changes: Mapping[str, tuple[bytes, str | None]],
        message: str,
    ) -> None:
        if start_from is not None:
            head = self._branch_head(repo, start_from)
            self._call(
                "POST",
                f"{self._repo(repo)}/git/refs",
                repo,
                f"creating branch {branch}",
                permission="write the repository's contents",
                json={"ref": f"refs/heads/{branch}", "sha": head},
            )
        for path, (data, sha) in changes.items():  # the contents API: one commit per file
            payload: dict[str, Any] = {"message": message, "content": b64(data), "branch": branch}
            if sha is not None:
                payload["sha"] = sha
            self._call(
                "PUT",
                f"{self._repo(repo)}/contents/{quote_path(path)}",
                repo,
                f"committing {path} on {branch}",
                permission="write the repository's contents",
                json=payload,
            )

    def _find_open(self, repo: str, base: str, branch: str) -> tuple[int, str, str] | None:
        owner = repo.split("/", 1)[0]
        items = self._call(
            "GET",
            f"{self._repo(repo)}/pulls",
            repo,
            "listing pull requests",
            permission="read pull requests",
            params={"state": "open", "head": f"{owner}:{branch}", "base": base},
        )
        for pr in items or []:
            if pr["head"]["ref"] == branch and pr["base"]["ref"] == base:
                return int(pr["number"]), str(pr["title"]), str(pr.get("body") or "")
        return None
