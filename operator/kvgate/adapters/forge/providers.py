"""The three forges as tables (`ForgeApi`): Gitea (and its API-compatible forks), GitHub and
GitLab, each the endpoints, fields and words of its REST API for the one client, `RestForge`.

Their API URLs look like `https://git.example/api/v1` (Gitea), `https://api.github.com` (GitHub
and GitHub Enterprise) and `https://gitlab.com/api/v4` (GitLab, where `repo` is the project
path)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from kvgate.adapters.forge.base import Changes, ForgeApi, b64

_GITLAB_DEVELOPER: Final = 30  # the access level that may push to unprotected branches


def _push_refusal(data: Any) -> str:
    """Gitea's and GitHub's `permissions.push`."""
    permissions = data.get("permissions") if isinstance(data, Mapping) else None
    if isinstance(permissions, Mapping) and permissions.get("push"):
        return ""
    return (
        "the token's user may read but not push (write access to the "
        "repository's code is needed to commit on a kvgate/ branch)"
    )


def _developer_refusal(data: Any) -> str:
    """GitLab's access level, the project's or the group's."""
    levels = [0]
    for key in ("project_access", "group_access"):
        access = (data.get("permissions") or {}).get(key) if isinstance(data, Mapping) else None
        if isinstance(access, Mapping) and isinstance(access.get("access_level"), int):
            levels.append(access["access_level"])
    if max(levels) >= _GITLAB_DEVELOPER:
        return ""
    return (
        f"the token's user has access level {max(levels)}; committing on a "
        f"kvgate/ branch needs Developer ({_GITLAB_DEVELOPER}) or above"
    )


def _gitea_files(
    branch: str, start_from: str | None, changes: Changes, message: str
) -> dict[str, Any]:
    files = [
        {"operation": "create", "path": path, "content": b64(data)}
        if sha is None
        else {"operation": "update", "path": path, "content": b64(data), "sha": sha}
        for path, (data, sha) in changes.items()
    ]
    target = {"branch": start_from, "new_branch": branch} if start_from else {"branch": branch}
    return {"message": message, "files": files, **target}


def _gitlab_actions(
    branch: str, start_from: str | None, changes: Changes, message: str
) -> dict[str, Any]:
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
    return payload


GITEA: Final = ForgeApi(
    name="gitea",
    auth_header="Authorization",
    auth_prefix="token ",
    headers={"Accept": "application/json"},
    repo_root="/repos/",
    quote_slashes=False,
    repo_word="repository",
    write_refusal=_push_refusal,
    write_permission="write the repository's code",
    branch="/branches/",
    branch_sha=("commit", "id"),
    file="/contents/",
    file_id="sha",
    commit_payload=_gitea_files,
    commits="/contents",
    noun="pull request",
    sign="#",
    pulls="/pulls",
    open_filter=lambda repo, base, branch: {"state": "open"},  # Gitea filters neither branch
    page_size=50,
    number="number",
    url="html_url",
    head=("head", "ref"),
    base=("base", "ref"),
    body="body",
    edit_method="PATCH",
    comments="/issues/{number}/comments",
    close={"state": "closed"},
)

GITHUB: Final = replace(  # Gitea's API followed GitHub's: the same but for these
    GITEA,
    name="github",
    auth_prefix="Bearer ",
    headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"},
    write_permission="write the repository's contents",
    branch="/git/ref/heads/",
    branch_sha=("object", "sha"),
    commit_payload=None,
    open_filter=lambda repo, base, branch: {
        "state": "open",
        "head": f"{repo.split('/', 1)[0]}:{branch}",
        "base": base,
    },
    page_size=0,
)

GITLAB: Final = ForgeApi(
    name="gitlab",
    auth_header="PRIVATE-TOKEN",
    auth_prefix="",
    headers={"Accept": "application/json"},
    repo_root="/projects/",
    quote_slashes=True,
    repo_word="project",
    write_refusal=_developer_refusal,
    write_permission="push to the repository (Developer)",
    branch="/repository/branches/",
    branch_sha=("commit", "id"),
    file="/repository/files/",
    file_id="blob_id",
    commit_payload=_gitlab_actions,
    commits="/repository/commits",
    noun="merge request",
    sign="!",
    pulls="/merge_requests",
    open_filter=lambda repo, base, branch: {
        "state": "opened",
        "source_branch": branch,
        "target_branch": base,
    },
    page_size=0,
    number="iid",
    url="web_url",
    head=("source_branch",),
    base=("target_branch",),
    body="description",
    edit_method="PUT",
    comments="/merge_requests/{number}/notes",
    close={"state_event": "close"},
)
