"""What the three forges share: the records, the errors' rules, the algorithm, and the one
client (`RestForge`) that speaks each forge's API from its table (`ForgeApi`, in `providers`)."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import quote

import httpx

from kvgate.change.gitops import is_kvgate_branch
from kvgate.errors import ForgeAccessError, ForgeError, KvgateError, SpecError
from kvgate.redact import hide
from kvgate.vocabulary import PullRequestState as PullRequestState  # re-exported

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT: Final = 15.0
MAX_PAGES: Final = 20  # open pull requests are listed at most 20 pages deep
_REPO: Final = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\Z")
# What an HTTP header value may carry without being refused or mangled: visible ASCII.
_TOKEN: Final = re.compile(r"^[\x21-\x7e]{8,4096}\Z")
Changes = Mapping[str, tuple[bytes, str | None]]  # path -> (content, blob id; None: new)


@dataclass(frozen=True, slots=True)
class PullRequest:
    number: int
    url: str
    state: PullRequestState
    merge_sha: str | None = None  # the merge (or squash) commit, once merged
    committed: bool = False  # open_or_update_pull_request made a new commit
    created: bool = False  # ... and opened the pull request (else it was there)
    branch: str = ""  # the branch it proposes (its head)


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


@dataclass(frozen=True, slots=True)
class ForgeApi:
    """One forge's REST API as data: where each call goes and the words of its answers. Paths
    are under the repository's (`repo_root` and the quoted repository)."""

    name: str
    auth_header: str  # the token's header, and what stands before the token in it
    auth_prefix: str
    headers: Mapping[str, str]  # the other headers
    repo_root: str
    quote_slashes: bool  # GitLab: a project, a branch or a file path is one URL part
    repo_word: str  # what the forge calls a repository
    write_refusal: Callable[[Any], str]  # the repository's JSON -> why the token cannot push
    write_permission: str
    branch: str  # + the branch: its head commit at `branch_sha`
    branch_sha: tuple[str, ...]
    file: str  # + the path (`?ref=` the branch): base64 `content`, blob id at `file_id`
    file_id: str
    # (branch, start from, changes, message) -> the JSON posted to `commits`; None: the
    # contents API, a commit per file (GitHub)
    commit_payload: Callable[[str, str | None, Changes, str], dict[str, Any]] | None
    commits: str
    noun: str  # "pull request", "merge request"
    sign: str  # before its number in the forge's own text
    pulls: str  # the list, the create and (+ /number) one pull request
    open_filter: Callable[[str, str, str], dict[str, str | int]]  # (repo, base, branch)
    page_size: int  # 0: one page (the filter finds it)
    number: str  # a pull request's JSON: its number, web address, head and base branch, body
    url: str
    head: tuple[str, ...]
    base: tuple[str, ...]
    body: str
    edit_method: str
    comments: str  # with {number}
    close: Mapping[str, str]  # what the edit sends to close


class RestForge:
    """One forge account (API URL and token), the algorithm shared by the three forges; `api` is
    the forge's table. `repo` is `owner/name` (GitLab: `group/project`)."""

    @property
    def name(self) -> str:
        return self.api.name

    def __init__(
        self,
        api: ForgeApi,
        api_url: str,
        token: str,
        *,
        client: httpx.Client | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.api = api
        self._token = token
        self._api = api_url.rstrip("/")
        self._own = client is None
        self._http = client if client is not None else httpx.Client()
        self._timeout = timeout

    def close(self) -> None:
        if self._own:
            self._http.close()

    # --- HTTP and errors --------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """`text` without the token (as sent, escaped or quoted): before any cut, so that a
        token quoted across the cut leaves none of its start."""
        return hide(text, self._token)

    def _call(
        self,
        method: str,
        repo: str,
        path: str,
        doing: str,
        *,
        permission: str,
        ok404: bool = False,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
    ) -> Any:
        """One API call on `path` under the repository's; the decoded JSON answer, or None for
        a 404 when `ok404`."""
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
                self._api + self._repo(repo) + path,
                headers=self._headers(),
                params=params,
                json=json,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            first = (self._scrub(str(exc)).splitlines() or [type(exc).__name__])[0][:200]
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
        detail = self._scrub(_server_message(response))[:200]
        said = f" ({detail})" if detail else ""
        refused = {
            401: f"the {self.name} token was refused (HTTP 401: invalid, expired or revoked)",
            403: f"the token lacks the permission to {permission} (HTTP 403)",
            404: "not found (HTTP 404): the repository or branch does not exist or the token "
            f"cannot {permission}",
        }.get(status)
        if refused is None:
            return ForgeError(repo, f"{doing}: HTTP {status}{said}", status)
        return ForgeAccessError(repo, f"{doing}: {refused}{said}", status)

    # --- the algorithm ----------------------------------------------------------------------

    def pull_request_state(self, repo: str, number: int) -> PullRequest:
        with self._answer_shape(repo):
            return self._state(repo, number)

    def find_open_pull_request(self, repo: str, base: str, branch: str) -> PullRequest | None:
        """The open pull request from kvgate's `branch` into `base` (None: there is none): how
        a pull request whose number was never recorded is found again."""
        if not is_kvgate_branch(branch):
            raise SpecError("branch", f"{branch!r} is not a kvgate/ branch")
        with self._answer_shape(repo):
            found = self._find_open(repo, base, branch)
            return None if found is None else self._state(repo, found[0])

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
            self._check_write_access(repo)
            wanted = {path: text.encode() for path, text in files.items()}
            changes: dict[str, tuple[bytes, str | None]] = {}
            start_from = base if self._branch_head(repo, branch) is None else None
            if start_from is not None and self._branch_head(repo, base) is None:
                raise ForgeError(repo, f"base branch {base!r} does not exist")
            # On a new branch every file is committed, and one already on the base branch (the
            # placeholder the recipes commit) is updated: the forges refuse to create a path
            # that exists.
            for path, data in wanted.items():
                current, file_id = self._read_file(repo, start_from or branch, path)
                if start_from is not None or current != data:
                    changes[path] = (data, file_id)
            committed = bool(changes)
            if committed:
                self._commit(repo, branch, start_from, changes, title)
            found = self._find_open(repo, base, branch)
            if found is None:
                pr = self._create(repo, base, branch, title, body)
                log.info(
                    "%s %s: opened pull request #%d from %s", self.name, repo, pr.number, branch
                )
                return replace(pr, committed=committed, created=True)
            number, old_title, old_body = found
            if (old_title, old_body) != (title, body):
                edit = {"title": title, self.api.body: body}
                self._edit(repo, number, f"editing {self._which(number)}", edit)
            log.info(
                "%s %s: updated pull request #%d (new commit: %s)",
                self.name,
                repo,
                number,
                committed,
            )
            return replace(self._state(repo, number), committed=committed)

    # --- each forge's API, read from its table ----------------------------------------------

    def _headers(self) -> dict[str, str]:
        api = self.api
        return {api.auth_header: api.auth_prefix + self._token, **api.headers}

    def _repo(self, repo: str) -> str:
        parts = [repo] if self.api.quote_slashes else repo.split("/", 1)
        return self.api.repo_root + "/".join(quote(p, safe="") for p in parts)

    def _quote(self, part: str) -> str:
        return quote(part, safe="" if self.api.quote_slashes else "/")

    def _check_write_access(self, repo: str) -> None:
        word = self.api.repo_word
        data = self._call("GET", repo, "", f"reading the {word}", permission=f"read the {word}")
        refusal = self.api.write_refusal(data)
        if refusal:
            raise ForgeAccessError(repo, refusal)

    def _branch_head(self, repo: str, branch: str) -> str | None:
        data = self._call(
            "GET",
            repo,
            self.api.branch + self._quote(branch),
            f"reading branch {branch}",
            permission="read the repository",
            ok404=True,
        )
        return None if data is None else str(_dig(data, self.api.branch_sha))

    def _read_file(self, repo: str, branch: str, path: str) -> tuple[bytes | None, str | None]:
        """The file's bytes and its blob id on `branch`; (None, None) when it is not there."""
        data = self._call(
            "GET",
            repo,
            self.api.file + self._quote(path),
            f"reading {path} on {branch}",
            permission="read the repository",
            ok404=True,
            params={"ref": branch},
        )
        if data is None:
            return None, None
        if not isinstance(data, Mapping) or data.get("type", "file") != "file":
            raise ForgeError(repo, f"{path} on {branch} is not a file")  # GitLab has no type
        try:
            content = base64.b64decode(str(data.get("content", "")), validate=False)
        except ValueError:
            raise ForgeError(repo, f"{path}: the file content is not base64") from None
        return content, str(data[self.api.file_id])

    def _commit(
        self, repo: str, branch: str, start_from: str | None, changes: Changes, message: str
    ) -> None:
        """Commit `changes` on `branch`, creating it from `start_from` when given: in one commit
        where the forge takes several files, else the branch first and a commit per file
        (GitHub's contents API)."""
        api, write = self.api, self.api.write_permission
        if api.commit_payload is not None:
            payload = api.commit_payload(branch, start_from, changes, message)
            self._call(
                "POST", repo, api.commits, f"committing on {branch}", permission=write, json=payload
            )
            return
        if start_from is not None:
            head = self._branch_head(repo, start_from)
            self._call(
                "POST",
                repo,
                "/git/refs",
                f"creating branch {branch}",
                permission=write,
                json={"ref": f"refs/heads/{branch}", "sha": head},
            )
        for path, (data, sha) in changes.items():
            one: dict[str, Any] = {"message": message, "content": b64(data), "branch": branch}
            if sha is not None:
                one["sha"] = sha
            path_url = api.file + self._quote(path)
            doing = f"committing {path} on {branch}"
            self._call("PUT", repo, path_url, doing, permission=write, json=one)

    def _find_open(self, repo: str, base: str, branch: str) -> tuple[int, str, str] | None:
        """(number, title, body) of the open pull request from `branch` into `base`; the filter
        is checked again on each answer (old GitLabs ignored it, Gitea has none)."""
        api = self.api
        params = api.open_filter(repo, base, branch)
        for page in range(1, MAX_PAGES + 1):
            paged = {"limit": api.page_size, "page": page} if api.page_size else {}
            items = self._call(
                "GET",
                repo,
                api.pulls,
                f"listing {api.noun}s",
                permission=f"read {api.noun}s",
                params={**params, **paged},
            )
            for pr in items or []:
                if _dig(pr, api.head) == branch and _dig(pr, api.base) == base:
                    return int(pr[api.number]), str(pr["title"]), str(pr.get(api.body) or "")
            if not api.page_size or not items or len(items) < api.page_size:
                return None
        return None

    def _create(self, repo: str, base: str, branch: str, title: str, body: str) -> PullRequest:
        api = self.api
        data = self._call(
            "POST",
            repo,
            api.pulls,
            f"opening a {api.noun}",
            permission=f"open {api.noun}s",
            json={api.head[0]: branch, api.base[0]: base, "title": title, api.body: body},
        )
        return self._pull_request(data)

    def _edit(self, repo: str, number: int, doing: str, json: Mapping[str, Any]) -> None:
        api = self.api
        path = f"{api.pulls}/{int(number)}"
        self._call(api.edit_method, repo, path, doing, permission=f"edit {api.noun}s", json=json)

    def _state(self, repo: str, number: int) -> PullRequest:
        api = self.api
        path, doing = f"{api.pulls}/{int(number)}", f"reading {self._which(number)}"
        return self._pull_request(
            self._call("GET", repo, path, doing, permission=f"read {api.noun}s")
        )

    def _close(self, repo: str, number: int, comment: str) -> None:
        api, which = self.api, self._which(number)
        self._call(
            "POST",
            repo,
            api.comments.format(number=int(number)),
            f"commenting on {which}",
            permission=f"comment on {api.noun}s",
            json={"body": comment},
        )
        self._edit(repo, number, f"closing {which}", dict(api.close))

    def _which(self, number: int) -> str:
        return f"{self.api.noun} {self.api.sign}{number}"

    def _pull_request(self, data: Mapping[str, Any]) -> PullRequest:
        """Gitea's and GitHub's `merged` flag, or GitLab's `merged` state; GitHub sets a test
        merge commit on an open pull request, so the sha is read only once merged."""
        merged = bool(data.get("merged")) or data.get("state") == "merged"
        if merged:
            state = PullRequestState.MERGED
        elif data.get("state") == "closed":
            state = PullRequestState.CLOSED
        else:
            state = PullRequestState.OPEN
        sha = data.get("merge_commit_sha") or data.get("squash_commit_sha") if merged else None
        return PullRequest(
            int(data[self.api.number]),
            str(data.get(self.api.url, "")),
            state,
            str(sha) if sha else None,
            branch=str(_dig(data, self.api.head)),
        )


def _dig(data: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        data = data[key]
    return data


def _server_message(response: httpx.Response) -> str:
    """The forge's own error text (`message` / `error`), its first line (cut by the caller,
    once the token is hidden)."""
    try:
        data = response.json()
    except ValueError:
        return ""
    keys = ("message", "error", "errors") if isinstance(data, Mapping) else ()
    text = next((str(data[key]) for key in keys if data.get(key)), "")
    return (text.splitlines() or [""])[0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
