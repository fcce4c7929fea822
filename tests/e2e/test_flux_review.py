"""kvgate's pull requests as a person reviews them, under Flux's own controllers (the setup of
test_flux_gitops.py, tests/e2e/flux.py): a pull request closed unmerged (Declined, production
unchanged) and one a person edited before merging (Failed/NotApplied: what Flux applied is not
what was tested). docs/gitops.md says what each asserts and how long it takes.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml
from flux import (
    FLUX_MANAGER,
    FluxControllers,
    deployment_args,
    git_repository,
    kustomization_ready,
    recipe,
    recorded_pr,
    template_writers,
)
from forge import LoopbackGitea
from support import (
    EXAMPLES,
    FAST_GATES,
    apply,
    condition,
    finish,
    install_crd,
    rollout,
    sim_deployment,
    start_forge_operator,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.forge]


@pytest.mark.timeout(900)
def test_under_flux_a_declined_pull_request_and_a_merge_unlike_the_test(
    cluster: Any, namespace: str, gitea: LoopbackGitea, flux: FluxControllers, tmp_path: Path
) -> None:
    """Two pullRequest rollouts side by side under examples/pull-request-flux.yaml: `keep`'s
    pull request is closed unmerged (Declined, production unchanged); `edit`'s is edited by a
    person before the merge (another --max-model-len), so what Flux applies is not what was
    tested: the rollout never reads Promoted and ends Failed/NotApplied at its applyDeadline,
    naming what the Deployment lacks."""
    install_crd(cluster)
    names = ("keep", "edit")
    placeholder = {"apiVersion": "apps/v1", "kind": "Deployment"}
    files: dict[str, str] = {}
    for n in names:
        files[f"apps/{n}/deployment.yaml"] = yaml.safe_dump(sim_deployment(n, env={"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400"}))  # fmt: skip
        files[f"apps/{n}/kustomization.yaml"] = yaml.safe_dump(
            {"resources": ["deployment.yaml"], "patches": [{"path": "kvgate-fp8.patch.yaml"}]}
        )
        files[f"apps/{n}/kvgate-fp8.patch.yaml"] = yaml.safe_dump({**placeholder, "metadata": {"name": n}})  # fmt: skip
    repo = gitea.create_repo("deploy", files=files)
    head = gitea.branch_head(repo, "main")
    git_repository(cluster, namespace, gitea, repo)
    apps = []
    for n in names:
        (app,) = recipe(EXAMPLES / "pull-request-flux.yaml", namespace,
                        {"./apps/vllm": f"./apps/{n}", "vllm": n})  # fmt: skip
        apps.append(app)
    apply(cluster, namespace, *apps)
    for n in names:
        wait_for(lambda n=n: kustomization_ready(cluster, namespace, n, f"main@sha1:{head}"),
                 180, f"Flux applied {n}", detail=flux.tails)  # fmt: skip
        wait_deployment_ready(cluster, namespace, n)
    operator = start_forge_operator(
        cluster, namespace, gitea.api_url, gitea.admin_token, repo, tmp_path / "operator.log"
    )
    try:
        for n in names:
            pr = {"provider": "gitea", "apiUrl": gitea.api_url, "repository": repo,
                  "path": f"apps/{n}/kvgate-fp8.patch.yaml",
                  "tokenSecretRef": {"name": "forge-token"}, "applyDeadline": "45s"}  # fmt: skip
            spec = {"extraArgs": ["--attention-backend", "TRITON_ATTN"], "gates": FAST_GATES,
                    "promotion": {"mode": "pullRequest", "pullRequest": pr}}  # fmt: skip
            apply(cluster, namespace, rollout(f"{n}-fp8", n, **spec))
        opened = {}
        for n in names:
            obj = wait_phase(cluster, namespace, f"{n}-fp8", {"PullRequestOpen", "RolledBack",
                             "Failed", "NotNeeded"}, 600)  # fmt: skip
            assert obj["status"]["phase"] == "PullRequestOpen", obj["status"].get("message")
            opened[n] = wait_for(
                lambda n=n: recorded_pr(cluster, namespace, f"{n}-fp8"),
                120,
                f"{n}'s pull request recorded",
            )

        # keep: a person closes the pull request unmerged
        gitea.api(
            "PATCH", f"/repos/{repo}/pulls/{opened['keep']['number']}", json={"state": "closed"}
        )
        obj = wait_phase(cluster, namespace, "keep-fp8", {"Declined", "Promoted", "Failed"}, 120)
        assert obj["status"]["phase"] == "Declined", obj["status"]

        # edit: a person changes the tested args on kvgate's branch, then merges
        branch = opened["edit"]["branch"]
        path = "apps/edit/kvgate-fp8.patch.yaml"
        tested = gitea.file(repo, branch, path)
        assert "8192" in tested
        gitea.commit(repo, branch, {path: tested.replace("8192", "4096")}, "a shorter context")
        gitea.merge(repo, int(opened["edit"]["number"]))
        merged = gitea.branch_head(repo, "main")
        wait_for(lambda: kustomization_ready(cluster, namespace, "edit", f"main@sha1:{merged}"),
                 180, "Flux applied the edited merge", detail=flux.tails)  # fmt: skip
        assert "4096" in deployment_args(cluster, namespace, "edit")
        obj = wait_phase(cluster, namespace, "edit-fp8", {"Promoted", "Failed"}, 240)
        status = obj["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NotApplied"), status
        assert f"was merged ({merged})" in status["message"], status["message"]
        assert "args of the Deployment changed from the tested config" in status["message"]
        assert condition(obj, "Stalled")["status"] == "True"

        # keep: Flux still applies main, which never had keep's change
        assert "--kv-cache-dtype" not in deployment_args(cluster, namespace, "keep")
        assert template_writers(cluster, namespace, "keep") == {FLUX_MANAGER}
        assert template_writers(cluster, namespace, "edit") == {FLUX_MANAGER}
    finally:
        finish(cluster, operator, [namespace])
