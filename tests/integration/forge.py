"""A throwaway Gitea on 127.0.0.1 for tests: the real forge the pull-request provider talks to.

    with LoopbackGitea.start(tmp_dir) as gitea:
        gitea.admin_token, gitea.api_url, gitea.create_repo("deploy", files={...})

The binary comes from `hack/build-binaries.sh --forge` (Gitea v1.26.0 from Go modules, with
its `options/`, `templates/`, `public/` copied next to it as `gitea-assets/`). The config is
built for isolation: SQLite in the temporary directory, no SSH, no mailer, no cron, no
update checker, offline mode, registration off, memory cache and session; it listens on
127.0.0.1 only and every request of this module goes to that address. Waits are bounded.
"""

from __future__ import annotations

import base64
import getpass
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN = "kvgate-admin"
START_TIMEOUT = 120.0  # a cold start migrates a fresh SQLite database: ~10-30 s on a busy box


def gitea_binary() -> Path | None:
    """The cached Gitea binary, or None when `hack/build-binaries.sh --forge` has not run."""
    out = subprocess.run(
        [str(REPO_ROOT / "hack/build-binaries.sh"), "--print"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    binary = Path(out) / "gitea"
    assets = Path(out) / "gitea-assets"
    return binary if binary.is_file() and (assets / "templates").is_dir() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(work: Path, port: int, assets: Path) -> str:
    as_root = os.geteuid() == 0
    return f"""\
APP_NAME = kvgate-test
RUN_MODE = prod
RUN_USER = {getpass.getuser()}
WORK_PATH = {work}
{"I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true" if as_root else ""}

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = {port}
DOMAIN = 127.0.0.1
ROOT_URL = http://127.0.0.1:{port}/
DISABLE_SSH = true
START_SSH_SERVER = false
OFFLINE_MODE = true
LFS_START_SERVER = false
STATIC_ROOT_PATH = {assets}
APP_DATA_PATH = {work}/data

[database]
DB_TYPE = sqlite3
PATH = {work}/data/gitea.db
SQLITE_JOURNAL_MODE = WAL

[repository]
ROOT = {work}/repositories
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = {secrets.token_hex(32)}
INTERNAL_TOKEN = {secrets.token_hex(48)}
PASSWORD_HASH_ALGO = bcrypt

[oauth2]
ENABLED = false

[service]
DISABLE_REGISTRATION = true
ENABLE_NOTIFY_MAIL = false
DEFAULT_KEEP_EMAIL_PRIVATE = true

[mailer]
ENABLED = false

[picture]
DISABLE_GRAVATAR = true
ENABLE_FEDERATED_AVATAR = false

[cron]
ENABLED = false

[cron.update_checker]
ENABLED = false

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[cache]
ADAPTER = memory

[session]
PROVIDER = memory

[queue]
TYPE = channel

[actions]
ENABLED = false

[packages]
ENABLED = false

[migrations]
ALLOW_LOCALNETWORKS = false

[log]
MODE = console
LEVEL = Warn
ROOT_PATH = {work}/log
"""


@dataclass
class LoopbackGitea:
    binary: Path
    work: Path
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    admin_token: str = ""
    startup_seconds: float = 0.0
    _password: str = field(default_factory=lambda: secrets.token_urlsafe(18))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v1"

    @property
    def config(self) -> Path:
        return self.work / "app.ini"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    @classmethod
    @contextmanager
    def start(cls, work: Path, binary: Path | None = None) -> Iterator[LoopbackGitea]:
        binary = binary or gitea_binary()
        if binary is None:
            raise RuntimeError("no Gitea binary: run hack/build-binaries.sh --forge")
        work.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        (work / "app.ini").write_text(_config(work, port, binary.parent / "gitea-assets"))
        log_path = work / "gitea.log"
        env = {
            "HOME": str(work),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GITEA_WORK_DIR": str(work),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        began = time.monotonic()
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [str(binary), "--config", str(work / "app.ini"), "web"],
                cwd=work,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        gitea = cls(binary, work, port, proc, log_path)
        try:
            gitea._wait_ready(began)
            gitea._create_admin(env)
            yield gitea
        finally:
            gitea.stop()

    def _wait_ready(self, began: float) -> None:
        deadline = began + START_TIMEOUT
        with httpx.Client(trust_env=False, timeout=5) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gitea exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    if http.get(f"{self.api_url}/version").status_code == 200:
                        self.startup_seconds = time.monotonic() - began
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"gitea not answering within {START_TIMEOUT:g} s:\n{self.log()}")

    def _create_admin(self, env: Mapping[str, str]) -> None:
        subprocess.run(
            [str(self.binary), "--config", str(self.config), "admin", "user", "create",
             "--admin", "--username", ADMIN, "--password", self._password,
             "--email", f"{ADMIN}@example.invalid", "--must-change-password=false"],
            cwd=self.work, env=dict(env), capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        self.admin_token = self.create_token(ADMIN, self._password, ["all"])

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=timeout)

    # --- the API, for test setup ---

    def api(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"token {token or self.admin_token}"}
        with httpx.Client(trust_env=False, timeout=30) as http:
            response = http.request(method, self.api_url + path, headers=headers, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code} {response.text}")
        return response

    def create_token(self, user: str, password: str, scopes: list[str]) -> str:
        with httpx.Client(trust_env=False, timeout=30) as http:
            response = http.post(
                f"{self.api_url}/users/{user}/tokens",
                auth=(user, password),
                json={"name": f"t-{secrets.token_hex(4)}", "scopes": scopes},
            )
        response.raise_for_status()
        return str(response.json()["sha1"])

    def admin_token_with(self, scopes: list[str]) -> str:
        """Another token of the admin user, limited to `scopes`."""
        return self.create_token(ADMIN, self._password, scopes)

    def create_user(self, name: str, scopes: list[str]) -> str:
        """A non-admin user; returns a token with `scopes` for it."""
        password = secrets.token_urlsafe(18)
        self.api(
            "POST",
            "/admin/users",
            json={
                "username": name,
                "email": f"{name}@example.invalid",
                "password": password,
                "must_change_password": False,
            },
        )
        return self.create_token(name, password, scopes)

    def create_repo(self, name: str, files: Mapping[str, str], *, private: bool = True) -> str:
        """`kvgate-admin/<name>` with `files` committed on `main`; returns `owner/name`."""
        self.api(
            "POST",
            "/user/repos",
            json={"name": name, "private": private, "auto_init": True, "default_branch": "main"},
        )
        repo = f"{ADMIN}/{name}"
        self.commit(repo, "main", files, "base manifests")
        return repo

    def commit(self, repo: str, branch: str, files: Mapping[str, str], message: str) -> str:
        """Create or update `files` on `branch`; returns the new commit SHA."""
        ops = []
        for path, text in files.items():
            op: dict[str, str] = {
                "path": path,
                "content": base64.b64encode(text.encode()).decode(),
                "operation": "create",
            }
            with httpx.Client(trust_env=False, timeout=30) as http:
                found = http.get(
                    f"{self.api_url}/repos/{repo}/contents/{path}",
                    params={"ref": branch},
                    headers={"Authorization": f"token {self.admin_token}"},
                )
            if found.status_code == 200:
                op.update(operation="update", sha=found.json()["sha"])
            ops.append(op)
        answer = self.api(
            "POST",
            f"/repos/{repo}/contents",
            json={"branch": branch, "message": message, "files": ops},
        ).json()
        return str(answer["commit"]["sha"])

    def merge(self, repo: str, number: int, timeout: float = 60.0) -> None:
        """Merge a pull request once Gitea has checked it (its check runs in a queue; until
        then the merge API answers 405 "Please try again later")."""
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=30) as http:
            while True:
                answer = http.post(
                    f"{self.api_url}/repos/{repo}/pulls/{number}/merge",
                    headers={"Authorization": f"token {self.admin_token}"},
                    json={"Do": "merge"},
                )
                if answer.status_code == 200:
                    return
                if answer.status_code != 405 or time.monotonic() > deadline:
                    raise RuntimeError(f"merge #{number}: HTTP {answer.status_code} {answer.text}")
                time.sleep(0.3)

    def branch_head(self, repo: str, branch: str) -> str:
        return str(self.api("GET", f"/repos/{repo}/branches/{branch}").json()["commit"]["id"])

    def file(self, repo: str, ref: str, path: str) -> str:
        data = self.api("GET", f"/repos/{repo}/contents/{path}", params={"ref": ref}).json()
        return base64.b64decode(data["content"]).decode()
