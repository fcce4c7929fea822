"""What the three forges share: the records, the errors' rules and the algorithm (`RestForge`)."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import quote

import httpx

from kvgate.change.gitops import is_kvgate_branch
from kvgate.errors import ForgeAccessError, ForgeError, KvgateError, SpecError
from kvgate.redact import scrub_text
from kvgate.vocabulary import PullRequestState as PullRequestState  # re-exported

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT: Final = 15.0
MAX_PAGES: Final = 20  # open pull requests are listed at most 20 pages deep
_REPO: Final = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")
# What an HTTP header value may carry without being refused or mangled: visible ASCII.
_TOKEN: Final = re.compile(r"^[\x21-\x7e]{8,4096}$")
_REDACTED: Final = "<redacted>"


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

    def find_open_pull_request(self, repo: str, base: str, branch: str) -> PullRequest | None: ...

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
            # A file already on the base branch (the placeholder the recipes commit) is updated:
            # the forges refuse to create a path that exists.
            for path, data in wanted.items():
                changes[path] = (data, self._read_file(repo, base, path)[1])
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
            return with_flags(pr, committed=committed, created=True)
        number, old_title, old_body = found
        if (old_title, old_body) != (title, body):
            self._edit(repo, number, title, body)
        log.info(
            "%s %s: updated pull request #%d (new commit: %s)", self.name, repo, number, committed
        )
        return with_flags(self._state(repo, number), committed=committed)

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


def with_flags(pr: PullRequest, *, committed: bool, created: bool = False) -> PullRequest:
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


def decode_content(content: object, where: str, repo: str) -> bytes:
    try:
        return base64.b64decode(str(content), validate=False)
    except ValueError:
        raise ForgeError(repo, f"{where}: the file content is not base64") from None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def quote_part(part: str) -> str:
    return quote(part, safe="")


def quote_path(path: str) -> str:
    return quote(path, safe="/")
