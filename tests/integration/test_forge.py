"""The pull-request provider against a real Gitea on 127.0.0.1 (built by `--forge`).

One Gitea per session (start-up migrates a fresh SQLite database); each test makes its own
repository with a kustomize base, so tests do not share branches or pull requests.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from forge import LoopbackGitea, gitea_binary

from kvgate.adapters.forge import PullRequestState, RestForge, forge_for
from kvgate.change.gitops import ANNOTATION_VERDICT, branch_name, render_kustomize_patch
from kvgate.errors import ForgeAccessError, KvgateError

pytestmark = [pytest.mark.integration, pytest.mark.forge, pytest.mark.tools]

PATCH_PATH = "apps/llama/kvgate-fp8.patch.yaml"
DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llama"},
    "spec": {
        "selector": {"matchLabels": {"app": "llama"}},
        "template": {
            "metadata": {"labels": {"app": "llama"}},
            "spec": {
                "containers": [
                    {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.23.0",
                        "args": ["serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"],
                        "env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}],
                    }
                ]
            },
        },
    },
}
BASE_FILES = {
    "apps/llama/deployment.yaml": yaml.safe_dump(DEPLOYMENT),
    "apps/llama/kustomization.yaml": (
        "resources: [deployment.yaml]\npatches:\n- path: kvgate-fp8.patch.yaml\n"
    ),
}


def _patch(key: str, backend: str = "TRITON_ATTN") -> str:
    container = DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    candidate = {
        "args": [*container["args"], "--kv-cache-dtype", "fp8"],
        "env": [{"name": "VLLM_ATTENTION_BACKEND", "value": backend}],
    }
    return render_kustomize_patch(
        deployment="llama",
        container="vllm",
        previous=container,
        candidate=candidate,
        verdict_key=key,
    )


@pytest.fixture(scope="session")
def gitea(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackGitea]:
    binary = gitea_binary()
    if binary is None:
        message = "no Gitea binary: run `make binaries` (hack/build-binaries.sh --forge)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: not skipping)", pytrace=False)
        pytest.skip(message)
    with LoopbackGitea.start(tmp_path_factory.mktemp("gitea"), binary) as server:
        print(f"\n[forge] Gitea up in {server.startup_seconds:.1f} s on {server.url}")
        yield server


@pytest.fixture
def forge(gitea: LoopbackGitea) -> Iterator[RestForge]:
    client = httpx.Client(trust_env=False)  # loopback: never through a proxy
    yield forge_for("gitea", gitea.api_url, gitea.admin_token, client=client)
    client.close()


_repos = iter(range(1, 1000))


@pytest.fixture
def repo(gitea: LoopbackGitea) -> str:
    return gitea.create_repo(f"deploy-{next(_repos)}", BASE_FILES)


BRANCH = branch_name("llama-fp8", "0123456789abcdef")


def test_open_then_update_idempotently(gitea: LoopbackGitea, forge: RestForge, repo: str) -> None:
    first = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8 KV for llama", "verdict k1"
    )
    assert (first.state, first.created, first.committed) == (PullRequestState.OPEN, True, True)
    assert gitea.file(repo, BRANCH, PATCH_PATH) == _patch("k1")
    head = gitea.branch_head(repo, BRANCH)

    again = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8 KV for llama", "verdict k1"
    )
    assert (again.number, again.created, again.committed) == (first.number, False, False)
    assert gitea.branch_head(repo, BRANCH) == head  # unchanged content: no new commit

    changed = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k2")}, "FP8 KV for llama (2)", "verdict k2"
    )
    assert (changed.number, changed.created, changed.committed) == (first.number, False, True)
    assert gitea.branch_head(repo, BRANCH) != head
    assert gitea.file(repo, BRANCH, PATCH_PATH) == _patch("k2")
    pulls = gitea.api("GET", f"/repos/{repo}/pulls", params={"state": "all"}).json()
    assert len(pulls) == 1  # updated, not duplicated
    assert (pulls[0]["title"], pulls[0]["body"]) == ("FP8 KV for llama (2)", "verdict k2")


def test_base_moved_meanwhile_then_merged_gives_the_merge_sha(
    gitea: LoopbackGitea, forge: RestForge, repo: str, tmp_path: Path
) -> None:
    pr = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8", "b"
    )
    # someone else moves main (another file); kvgate updates its PR on top of its branch
    gitea.commit(repo, "main", {"apps/other/README.md": "unrelated\n"}, "other team")
    updated = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k2")}, "FP8", "b"
    )
    assert (updated.number, updated.committed) == (pr.number, True)
    assert forge.pull_request_state(repo, pr.number).merge_sha is None

    gitea.merge(repo, pr.number)
    merged = forge.pull_request_state(repo, pr.number)
    assert merged.state is PullRequestState.MERGED
    assert merged.merge_sha == gitea.branch_head(repo, "main")
    assert gitea.file(repo, merged.merge_sha, PATCH_PATH) == _patch("k2")
    assert gitea.file(repo, merged.merge_sha, "apps/other/README.md") == "unrelated\n"
    _kustomize_at(gitea, repo, merged.merge_sha, tmp_path)


def _kustomize_at(gitea: LoopbackGitea, repo: str, sha: str, tmp_path: Path) -> None:
    """What a GitOps tool renders from the merge commit: the tested args and env."""
    kubectl = shutil.which("kubectl") or next(
        (str(p) for p in Path.home().glob(".cache/kvgate/bin/*/kubectl")), None
    )
    assert kubectl is not None, "kubectl needed for the render check: run hack/build-binaries.sh"
    for name in ("deployment.yaml", "kustomization.yaml", "kvgate-fp8.patch.yaml"):
        (tmp_path / name).write_text(gitea.file(repo, sha, f"apps/llama/{name}"))
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)["spec"]["template"]
    assert rendered["metadata"]["annotations"] == {ANNOTATION_VERDICT: "k2"}
    (container,) = rendered["spec"]["containers"]
    assert container["args"][-2:] == ["--kv-cache-dtype", "fp8"]
    assert container["env"] == [{"name": "VLLM_ATTENTION_BACKEND", "value": "TRITON_ATTN"}]


def test_a_placeholder_on_the_base_branch_is_replaced_by_the_pull_request(
    gitea: LoopbackGitea, forge: RestForge, tmp_path: Path
) -> None:
    # The recipe (examples/pull-request-placeholder.patch.yaml): the path kvgate owns holds a
    # no-op patch from the start, so the kustomization renders before kvgate's first PR.
    placeholder = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: llama\n"
    repo = gitea.create_repo(f"deploy-{next(_repos)}", {**BASE_FILES, PATCH_PATH: placeholder})
    pr = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k2")}, "FP8", "b"
    )
    assert (pr.created, pr.committed) == (True, True)
    assert gitea.file(repo, "main", PATCH_PATH) == placeholder
    gitea.merge(repo, pr.number)
    merged = forge.pull_request_state(repo, pr.number)
    assert merged.merge_sha is not None
    _kustomize_at(gitea, repo, merged.merge_sha, tmp_path)  # the tested change, rendered


def test_closed_unmerged_reads_closed(gitea: LoopbackGitea, forge: RestForge, repo: str) -> None:
    pr = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8", "b"
    )
    gitea.api("PATCH", f"/repos/{repo}/pulls/{pr.number}", json={"state": "closed"})
    closed = forge.pull_request_state(repo, pr.number)
    assert (closed.state, closed.merge_sha) == (PullRequestState.CLOSED, None)
    assert "kvgate-fp8" not in gitea.api("GET", f"/repos/{repo}/contents/apps/llama").text


def _branches(gitea: LoopbackGitea, repo: str) -> list[str]:
    return [b["name"] for b in gitea.api("GET", f"/repos/{repo}/branches").json()]


def _access_error(
    gitea: LoopbackGitea, token: str, repo: str, caplog: pytest.LogCaptureFixture
) -> str:
    caplog.set_level(logging.DEBUG)
    with httpx.Client(trust_env=False) as client:
        forge = forge_for("gitea", gitea.api_url, token, client=client)
        with pytest.raises(ForgeAccessError) as caught:
            forge.open_or_update_pull_request(
                repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8", "b"
            )
    text = str(caught.value)
    assert text.startswith(f"repository {repo}: ")
    for shown in (text, repr(caught.value), caplog.text):
        assert token not in shown
    assert caught.value.__cause__ is None  # no chained httpx error carrying the request
    return text


def test_token_of_a_user_without_access(
    gitea: LoopbackGitea, repo: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = gitea.create_user(f"outsider{next(_repos)}", ["write:repository", "read:user"])
    text = _access_error(gitea, token, repo, caplog)
    assert "HTTP 404" in text and "cannot read the repository" in text


def test_token_of_a_read_only_collaborator(
    gitea: LoopbackGitea, repo: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"reader{next(_repos)}"
    token = gitea.create_user(user, ["write:repository", "read:user"])
    gitea.api("PUT", f"/repos/{repo}/collaborators/{user}", json={"permission": "read"})
    text = _access_error(gitea, token, repo, caplog)
    assert "may read but not push" in text
    assert BRANCH not in _branches(gitea, repo)


def test_token_scoped_read_only(
    gitea: LoopbackGitea, repo: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = gitea.admin_token_with(["read:repository"])
    text = _access_error(gitea, token, repo, caplog)
    assert "lacks the permission to write the repository's code (HTTP 403)" in text
    assert BRANCH not in _branches(gitea, repo)


def test_revoked_token(gitea: LoopbackGitea, repo: str, caplog: pytest.LogCaptureFixture) -> None:
    text = _access_error(gitea, "0123456789abcdef0123456789abcdef01234567", repo, caplog)
    assert "HTTP 401" in text


def test_no_branch_outside_kvgate(gitea: LoopbackGitea, forge: RestForge, repo: str) -> None:
    head = gitea.branch_head(repo, "main")
    with pytest.raises(KvgateError, match="only branches under kvgate/"):
        forge.open_or_update_pull_request(repo, "main", "main", {PATCH_PATH: "x"}, "t", "b")
    assert gitea.branch_head(repo, "main") == head
    assert _branches(gitea, repo) == ["main"]


def test_superseded_pull_request_is_closed_with_a_comment(
    gitea: LoopbackGitea, forge: RestForge, repo: str
) -> None:
    old = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8", "b"
    )
    newer = branch_name("llama-fp8", "fedcba9876543210")
    new = forge.open_or_update_pull_request(
        repo, "main", newer, {PATCH_PATH: _patch("k2")}, "FP8 (2)", "b"
    )
    assert new.number != old.number and new.created
    closed = forge.close_pull_request(repo, old.number, f"superseded by {newer}")
    assert (closed.state, closed.branch) == (PullRequestState.CLOSED, BRANCH)
    comments = gitea.api("GET", f"/repos/{repo}/issues/{old.number}/comments").json()
    assert [c["body"] for c in comments] == [f"superseded by {newer}"]
    assert forge.pull_request_state(repo, new.number).state is PullRequestState.OPEN


def test_an_unrecorded_pull_request_is_found_again_by_its_branch(
    gitea: LoopbackGitea, forge: RestForge, repo: str
) -> None:
    # the operator died between opening and recording: the branch alone finds it, to close it
    assert forge.find_open_pull_request(repo, "main", BRANCH) is None
    opened = forge.open_or_update_pull_request(
        repo, "main", BRANCH, {PATCH_PATH: _patch("k1")}, "FP8", "b"
    )
    found = forge.find_open_pull_request(repo, "main", BRANCH)
    assert found is not None
    assert (found.number, found.state, found.branch) == (
        opened.number, PullRequestState.OPEN, BRANCH,
    )  # fmt: skip
    assert found.url == opened.url
    forge.close_pull_request(repo, found.number, "the rollout was aborted")
    assert forge.find_open_pull_request(repo, "main", BRANCH) is None


def test_never_closes_a_pull_request_outside_kvgate_branches(
    gitea: LoopbackGitea, forge: RestForge, repo: str
) -> None:
    gitea.api("POST", f"/repos/{repo}/branches", json={"new_branch_name": "feature/x"})
    gitea.commit(repo, "feature/x", {"apps/llama/README.md": "human\n"}, "a human's change")
    number = gitea.api(
        "POST", f"/repos/{repo}/pulls", json={"head": "feature/x", "base": "main", "title": "h"}
    ).json()["number"]
    with pytest.raises(ForgeAccessError, match="kvgate closes only its own"):
        forge.close_pull_request(repo, number, "superseded")
    assert forge.pull_request_state(repo, number).state is PullRequestState.OPEN
    assert gitea.api("GET", f"/repos/{repo}/issues/{number}/comments").json() == []
