"""Pull requests on a Git forge (Gitea, GitHub, GitLab) through its REST API, over httpx.

No clone, no git binary, no SSH key: files are committed through the forge's API (Gitea's
`POST /repos/{o}/{r}/contents`, GitHub's contents API, GitLab's commits API), on a branch
created from the base branch's current head, so a moved base needs no rebase.

    forge = GiteaForge("http://127.0.0.1:3000/api/v1", token)
    pr = forge.open_or_update_pull_request(
        "org/deploy", "main", "kvgate/llama-0123456789abcdef",
        {"apps/llama/kvgate-fp8.patch.yaml": text}, "FP8 KV cache for llama", body)
    forge.pull_request_state("org/deploy", pr.number).state  # open / merged / closed

Idempotent: an open pull request for the branch is updated, never duplicated, and files that
already hold the content make no new commit. kvgate writes only branches under `kvgate/`.
Every failure is a `ForgeError`; a refused token or a missing permission is a
`ForgeAccessError` naming the repository and the permission. The token never appears in an
error or a log line: it is checked before use (a header value cannot carry it otherwise) and
removed from every text that came back from the server.
"""

from __future__ import annotations

import base64
import enum
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import quote

import httpx

from kvgate.errors import ForgeAccessError, ForgeError, KvgateError, SpecError
from kvgate.gitops import is_kvgate_branch
from kvgate.redact import scrub_text

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT: Final = 15.0
MAX_PAGES: Final = 20  # open pull requests are listed at most 20 pages deep
_REPO: Final = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")
# What an HTTP header value may carry without being refused or mangled: visible ASCII.
_TOKEN: Final = re.compile(r"^[\x21-\x7e]{8,4096}$")
_REDACTED: Final = "<redacted>"


class PullRequestState(enum.StrEnum):
    OPEN = "open"
    MERGED = "merged"
    CLOSED = "closed"  # closed without merging: declined


@dataclass(frozen=True, slots=True)
class PullRequest:
    number: int
    url: str
    state: PullRequestState
    merge_sha: str | None = None  # the merge (or squash) commit, once merged
    committed: bool = False  # open_or_update_pull_request made a new commit
    created: bool = False  # ... and opened the pull request (else it was there)
    branch: str = ""  # the branch it proposes (its head)


class Forge(Protocol):
    """One forge account (API URL and token); `repo` is `owner/name` (GitLab: `group/project`)."""

    def open_or_update_pull_request(
        self,
        repo: str,
        base: str,
        branch: str,
        files: Mapping[str, str],
        title: str,
        body: str,
    ) -> PullRequest: ...

    def pull_request_state(self, repo: str, number: int) -> PullRequest: ...

    def close_pull_request(self, repo: str, number: int, comment: str) -> PullRequest: ...


def _check_arguments(repo: str, base: str, branch: str, files: Mapping[str, str]) -> None:
    if not _REPO.match(repo) or ".." in repo:
        raise SpecError("promotion.git.repo", f"{repo!r} is not owner/name")
    if not is_kvgate_branch(branch):
        raise SpecError("branch", f"{branch!r}: kvgate writes only branches under kvgate/")
    if not base or base == branch or base.startswith("kvgate/"):
        raise SpecError("promotion.git.baseBranch", f"{base!r} cannot be the base branch")
    if not files:
        raise SpecError("files", "nothing to commit")
    for path in files:
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in path:
            raise SpecError("promotion.git.path", f"{path!r} is not a relative file path")


class RestForge:
    """The algorithm, shared by the three forges; subclasses speak each one's API."""

    name: str = "forge"

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        client: httpx.Client | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._token = token
        self._api = api_url.rstrip("/")
        self._own = client is None
        self._http = client if client is not None else httpx.Client()
        self._timeout = timeout

    def close(self) -> None:
        if self._own:
            self._http.close()

    # --- HTTP and errors --------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _scrub(self, text: str) -> str:
        return scrub_text(text.replace(self._token, _REDACTED))

    def _call(
        self,
        method: str,
        path: str,
        repo: str,
        doing: str,
        *,
        permission: str,
        ok404: bool = False,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
    ) -> Any:
        """One API call; the decoded JSON answer, or None for a 404 when `ok404`."""
        if not _TOKEN.match(self._token):
            # Never echo it: a newline or a control character would also break the header.
            raise ForgeAccessError(
                repo,
                f"the {self.name} token is not 8-4096 visible ASCII characters (a newline, "
                "space or control character from the Secret?); check the Secret's value",
            )
        try:
            response = self._http.request(
                method,
                self._api + path,
                headers=self._headers(),
                params=params,
                json=json,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise ForgeError(repo, self._scrub(f"{doing}: {type(exc).__name__}: {first}")) from None
        status = response.status_code
        if status == 404 and ok404:
            return None
        if status >= 400:
            raise self._error(repo, doing, response, permission)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ForgeError(
                repo, f"{doing}: HTTP {status} answer is not JSON (is the API URL right?)", status
            ) from None

    def _error(
        self, repo: str, doing: str, response: httpx.Response, permission: str
    ) -> ForgeError:
        status = response.status_code
        detail = self._scrub(_server_message(response))
        said = f" ({detail})" if detail else ""
        if status == 401:
            return ForgeAccessError(
                repo,
                f"{doing}: the {self.name} token was refused (HTTP 401: invalid, expired "
                f"or revoked){said}",
                status,
            )
        if status == 403:
            return ForgeAccessError(
                repo,
                f"{doing}: the token lacks the permission to {permission} (HTTP 403){said}",
                status,
            )
        if status == 404:
            return ForgeAccessError(
                repo,
                f"{doing}: not found (HTTP 404): the repository or branch does not exist "
                f"or the token cannot {permission}{said}",
                status,
            )
        return ForgeError(repo, f"{doing}: HTTP {status}{said}", status)

    # --- the algorithm ----------------------------------------------------------------------

    def pull_request_state(self, repo: str, number: int) -> PullRequest:
        with self._answer_shape(repo):
            return self._state(repo, number)

    def close_pull_request(self, repo: str, number: int, comment: str) -> PullRequest:
        """Close an open pull request of kvgate's with a comment (a new configuration
        supersedes it). One from a branch outside `kvgate/` is refused: kvgate closes only its
        own. Closing a closed or merged one changes nothing."""
        with self._answer_shape(repo):
            pr = self._state(repo, number)
            if not is_kvgate_branch(pr.branch):
                raise ForgeAccessError(
                    repo,
                    f"pull request {number} proposes {pr.branch!r}, not a kvgate/ branch: "
                    "kvgate closes only its own",
                )
            if pr.state is not PullRequestState.OPEN:
                return pr
            self._close(repo, number, comment)
            log.info("%s %s: closed pull request #%d", self.name, repo, number)
            return self._state(repo, number)

    @contextmanager
    def _answer_shape(self, repo: str) -> Iterator[None]:
        """An answer without the documented fields is one ForgeError, not a KeyError."""
        try:
            yield
        except KvgateError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ForgeError(
                repo,
                f"the {self.name} API answered without the documented fields "
                f"({type(exc).__name__}: {self._scrub(str(exc))[:100]}); is the API URL right?",
            ) from None

    def open_or_update_pull_request(
        self,
        repo: str,
        base: str,
        branch: str,
        files: Mapping[str, str],
        title: str,
        body: str,
    ) -> PullRequest:
        _check_arguments(repo, base, branch, files)
        with self._answer_shape(repo):
            return self._open_or_update(repo, base, branch, files, title, body)

    def _open_or_update(
        self,
        repo: str,
        base: str,
        branch: str,
        files: Mapping[str, str],
        title: str,
        body: str,
    ) -> PullRequest:
        self._check_write_access(repo)
        wanted = {path: text.encode() for path, text in files.items()}
        changes: dict[str, tuple[bytes, str | None]] = {}
        if self._branch_head(repo, branch) is None:
            if self._branch_head(repo, base) is None:
                raise ForgeError(repo, f"base branch {base!r} does not exist")
            changes = {path: (data, None) for path, data in wanted.items()}
            self._commit(repo, branch, base, changes, title)
            committed = True
        else:
            for path, data in wanted.items():
                current, file_id = self._read_file(repo, branch, path)
                if current != data:
                    changes[path] = (data, file_id)
            committed = bool(changes)
            if committed:
                self._commit(repo, branch, None, changes, title)
        found = self._find_open(repo, base, branch)
        if found is None:
            pr = self._create(repo, base, branch, title, body)
            log.info("%s %s: opened pull request #%d from %s", self.name, repo, pr.number, branch)
            return _with(pr, committed=committed, created=True)
        number, old_title, old_body = found
        if (old_title, old_body) != (title, body):
            self._edit(repo, number, title, body)
        log.info(
            "%s %s: updated pull request #%d (new commit: %s)", self.name, repo, number, committed
        )
        return _with(self._state(repo, number), committed=committed)

    # --- what each forge implements ---------------------------------------------------------

    def _check_write_access(self, repo: str) -> None:
        raise NotImplementedError

    def _branch_head(self, repo: str, branch: str) -> str | None:
        raise NotImplementedError

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        """The file's bytes and its blob id on `branch`; (None, None) when it is not there."""
        raise NotImplementedError

    def _commit(
        self,
        repo: str,
        branch: str,
        start_from: str | None,
        changes: Mapping[str, tuple[bytes, str | None]],
        message: str,
    ) -> None:
        """Commit `changes` ({path: (content, blob id or None for a new file)}) on `branch`,
        creating it from `start_from` when given."""
        raise NotImplementedError

    def _find_open(self, repo: str, base: str, branch: str) -> tuple[int, str, str] | None:
        """(number, title, body) of the open pull request from `branch` into `base`."""
        raise NotImplementedError

    def _create(self, repo: str, base: str, branch: str, title: str, body: str) -> PullRequest:
        raise NotImplementedError

    def _edit(self, repo: str, number: int, title: str, body: str) -> None:
        raise NotImplementedError

    def _state(self, repo: str, number: int) -> PullRequest:
        raise NotImplementedError

    def _close(self, repo: str, number: int, comment: str) -> None:
        raise NotImplementedError


def _with(pr: PullRequest, *, committed: bool, created: bool = False) -> PullRequest:
    return PullRequest(pr.number, pr.url, pr.state, pr.merge_sha, committed, created, pr.branch)


def _server_message(response: httpx.Response) -> str:
    """The forge's own error text (`message` / `error`), first line, cut short."""
    try:
        data = response.json()
    except ValueError:
        return ""
    text = ""
    if isinstance(data, Mapping):
        for key in ("message", "error", "errors"):
            if data.get(key):
                text = str(data[key])
                break
    return (text.splitlines() or [""])[0][:200]


def _decode(content: object, where: str, repo: str) -> bytes:
    try:
        return base64.b64decode(str(content), validate=False)
    except ValueError:
        raise ForgeError(repo, f"{where}: the file content is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _quote(part: str) -> str:
    return quote(part, safe="")


def _path(path: str) -> str:
    return quote(path, safe="/")


# --- Gitea ----------------------------------------------------------------------------------


class GiteaForge(RestForge):
    """Gitea (and its API-compatible forks), `api_url` like `https://git.example/api/v1`."""

    name = "gitea"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}", "Accept": "application/json"}

    def _repo(self, repo: str) -> str:
        return "/repos/" + "/".join(_quote(p) for p in repo.split("/", 1))

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
            f"{self._repo(repo)}/branches/{_path(branch)}",
            repo,
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(data["commit"]["id"])

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        data = self._call(
            "GET",
            f"{self._repo(repo)}/contents/{_path(path)}",
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
        return _decode(data.get("content", ""), path, repo), str(data["sha"])

    def _commit(
        self,
        repo: str,
        branch: str,
        start_from: str | None,
        changes: Mapping[str, tuple[bytes, str | None]],
        message: str,
    ) -> None:
        files = [
            {"operation": "create", "path": path, "content": _b64(data)}
            if sha is None
            else {"operation": "update", "path": path, "content": _b64(data), "sha": sha}
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
        return _gitea_pr(data)

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
        return _gitea_pr(data)

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


def _gitea_pr(data: Mapping[str, Any]) -> PullRequest:
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
            f"{self._repo(repo)}/git/ref/heads/{_path(branch)}",
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
            payload: dict[str, Any] = {"message": message, "content": _b64(data), "branch": branch}
            if sha is not None:
                payload["sha"] = sha
            self._call(
                "PUT",
                f"{self._repo(repo)}/contents/{_path(path)}",
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


# --- GitLab ---------------------------------------------------------------------------------

_GITLAB_DEVELOPER: Final = 30  # the access level that may push to unprotected branches


class GitLabForge(RestForge):
    """GitLab, `api_url` like `https://gitlab.com/api/v4`; `repo` is the project path."""

    name = "gitlab"

    def _headers(self) -> dict[str, str]:
        return {"PRIVATE-TOKEN": self._token, "Accept": "application/json"}

    def _project(self, repo: str) -> str:
        return "/projects/" + _quote(repo)

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
            f"{self._project(repo)}/repository/branches/{_quote(branch)}",
            repo,
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(data["commit"]["id"])

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        data = self._call(
            "GET",
            f"{self._project(repo)}/repository/files/{_quote(path)}",
            repo,
            f"reading {path} on {branch}",
            permission="read the repository",
            ok404=True,
            params={"ref": branch},
        )
        if data is None:
            return None, None
        return _decode(data.get("content", ""), path, repo), str(data.get("blob_id", ""))

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
                "content": _b64(data),
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


FORGES: Final[Mapping[str, type[RestForge]]] = {
    "gitea": GiteaForge,
    "github": GitHubForge,
    "gitlab": GitLabForge,
}


def forge_for(
    provider: str, api_url: str, token: str, *, client: httpx.Client | None = None
) -> RestForge:
    """The forge client for `provider` (`gitea`, `github` or `gitlab`)."""
    try:
        cls = FORGES[provider]
    except KeyError:
        raise SpecError(
            "promotion.git.provider", f"{provider!r} is not one of {', '.join(FORGES)}"
        ) from None
    return cls(api_url, token, client=client)
