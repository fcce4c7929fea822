"""kvgate under Flux's own controllers: the local control plane, `kvgate run`, a loopback Gitea
holding the GitOps repository, and Flux's source-controller and kustomize-controller (built from
Go modules, `hack/build-binaries.sh --flux`) applying it. Nothing here plays the GitOps tool:
Flux fetches the repository over HTTP and applies it.

The recipes are read from examples/ and only moved into the test's namespace, repository and
paths. pullRequest mode (examples/pull-request-flux.yaml): Flux applies the base; the rollout
passes and opens its pull request; the test merges it as a person would; Flux fetches the merge
commit and applies it; kvgate verifies what Flux applied and ends Promoted, and only Flux's field
manager ever wrote the pod template. Gate mode (examples/gate-flux.yaml): Flux holds the FP8 args
until the gate opens, and keeps them out when it closes. A declined pull request and one edited
before its merge are in test_flux_review.py (one module each keeps each under 5 minutes).
docs/gitops.md says what each asserts and how long it takes.
"""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from flux import (
    FLUX_MANAGER,
    PATCH,
    FluxControllers,
    deployment_args,
    git_repository,
    ks_ready,
    kustomization_ready,
    recipe,
    template_writers,
)
from forge import LoopbackGitea
from support import (
    EXAMPLES,
    FAST_GATES,
    Operator,
    apply,
    finish,
    get,
    install_crd,
    pull_request_promotion,
    rollout,
    sim_deployment,
    start_forge_operator,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.forge]


@pytest.mark.timeout(900)
def test_flux_applies_the_merged_pull_request_and_kvgate_promotes_it(
    cluster: Any, namespace: str, gitea: LoopbackGitea, flux: FluxControllers, tmp_path: Path
) -> None:
    install_crd(cluster)
    deployment = sim_deployment(
        "sim", env={"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400"}
    )
    placeholder = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sim"}}
    base = {
        "apps/sim/deployment.yaml": yaml.safe_dump(deployment),
        "apps/sim/kustomization.yaml": yaml.safe_dump(
            {"resources": ["deployment.yaml"], "patches": [{"path": "kvgate-fp8.patch.yaml"}]}
        ),
        PATCH: yaml.safe_dump(placeholder),
    }
    repo = gitea.create_repo("deploy", files=base)
    head = gitea.branch_head(repo, "main")
    git_repository(cluster, namespace, gitea, repo)
    (app,) = recipe(
        EXAMPLES / "pull-request-flux.yaml", namespace, {"./apps/vllm": "./apps/sim", "vllm": "sim"}
    )
    assert app["metadata"]["name"] == "sim" and app["spec"]["wait"] is False
    apply(cluster, namespace, app)
    wait_for(
        lambda: kustomization_ready(cluster, namespace, app["metadata"]["name"], f"main@sha1:{head}"),
        180,
        "Flux applied the base",
        detail=flux.tails,
    )  # fmt: skip
    wait_deployment_ready(cluster, namespace, "sim")
    assert template_writers(cluster, namespace) == {FLUX_MANAGER}

    token = gitea.admin_token
    operator = start_forge_operator(
        cluster, namespace, gitea.api_url, token, repo, tmp_path / "operator.log"
    )
    try:
        spec = {
            "extraArgs": ["--attention-backend", "TRITON_ATTN"],
            "gates": FAST_GATES,
            "promotion": pull_request_promotion(gitea.api_url, repo, PATCH, "5m"),
        }
        apply(cluster, namespace, rollout("sim-fp8", "sim", **spec))
        obj = wait_phase(cluster, namespace, "sim-fp8", {"PullRequestOpen", "RolledBack",
                         "Failed", "NotNeeded"}, 600)  # fmt: skip
        assert obj["status"]["phase"] == "PullRequestOpen", obj["status"].get("message")

        def recorded() -> dict[str, Any] | None:
            status = (get(cluster, namespace, "kvr", "sim-fp8") or {}).get("status") or {}
            return status if (status.get("pullRequest") or {}).get("number") else None

        status = wait_for(recorded, 120, "the pull request recorded")
        number = int(status["pullRequest"]["number"])
        # nothing changed in the cluster yet: Flux still applies main, which lacks the change
        live = get(cluster, namespace, "deployment", "sim") or {}
        assert "--kv-cache-dtype" not in live["spec"]["template"]["spec"]["containers"][0]["args"]

        gitea.merge(repo, number)  # a person merges
        obj = wait_phase(cluster, namespace, "sim-fp8", {"PullRequestMerged", "Promoted"}, 120)
        merge_sha = obj["status"]["pullRequest"]["mergeSha"]
        assert merge_sha == gitea.branch_head(repo, "main")

        # Flux fetches the merge commit and applies it; kvgate verifies what Flux applied
        wait_for(
            lambda: kustomization_ready(
                cluster, namespace, app["metadata"]["name"], f"main@sha1:{merge_sha}"
            ),
            180,
            "Flux applied the merge commit",
            detail=flux.tails,
        )
        obj = wait_phase(cluster, namespace, "sim-fp8", {"Promoted", "Failed"}, 300)
        assert obj["status"]["phase"] == "Promoted", obj["status"].get("message")
        live = get(cluster, namespace, "deployment", "sim") or {}
        container = live["spec"]["template"]["spec"]["containers"][0]
        assert "--kv-cache-dtype" in container["args"] and "TRITON_ATTN" in container["args"]
        annotations = live["spec"]["template"]["metadata"].get("annotations") or {}
        assert annotations.get("kvgate.io/verdict") == obj["status"]["verdict"]["key"]["digest"]
        assert template_writers(cluster, namespace) == {FLUX_MANAGER}  # kvgate never wrote it
        assert token not in operator.log()
    finally:
        finish(cluster, operator, [namespace])


@pytest.mark.timeout(900)
def test_flux_applies_the_fp8_args_only_through_an_open_gate(
    cluster: Any, namespace: str, gitea: LoopbackGitea, flux: FluxControllers, tmp_path: Path
) -> None:
    """Gate mode with examples/gate-flux.yaml, twice side by side: `good` (the tested args pass)
    and `bad` (the L4 trap: FP8 without TRITON_ATTN crashes the candidate). One commit adds each
    gate rollout and, in the same commit, the FP8 args to its Deployment. While a rollout runs,
    Flux holds its app's Kustomization (dependency not ready) and the args stay out; the open
    gate lets Flux apply them; the closed one keeps production as it was, Flux reports the gate's
    health check failed on the rollout, and kvgate's reason is on the rollout."""
    install_crd(cluster)
    names = ("good", "bad")
    extra = {"good": ["--attention-backend", "TRITON_ATTN"], "bad": []}
    deployments = {n: sim_deployment(n, env={"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400"}) for n in names}  # fmt: skip
    placeholder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-gate"}}
    files: dict[str, str] = {}
    for n in names:
        files[f"apps/{n}/deployment.yaml"] = yaml.safe_dump(deployments[n])
        files[f"apps/{n}/kustomization.yaml"] = yaml.safe_dump({"resources": ["deployment.yaml"]})
        files[f"gates/{n}/kustomization.yaml"] = yaml.safe_dump({"resources": ["gate.yaml"]})
        files[f"gates/{n}/gate.yaml"] = yaml.safe_dump({**placeholder, "metadata": {"name": f"no-gate-{n}"}})  # fmt: skip
    repo = gitea.create_repo("deploy", files=files)
    head = gitea.branch_head(repo, "main")
    git_repository(cluster, namespace, gitea, repo)
    kustomizations = []
    for n in names:
        renames = {"./gates": f"./gates/{n}", "./apps/vllm": f"./apps/{n}",
                   "kvgate-gate": f"gate-{n}", "vllm": n}  # fmt: skip
        kustomizations += recipe(EXAMPLES / "gate-flux.yaml", namespace, renames)
    apply(cluster, namespace, *kustomizations)
    for ks in kustomizations:
        name = ks["metadata"]["name"]
        wait_for(lambda name=name: kustomization_ready(cluster, namespace, name, f"main@sha1:{head}"),
                 180, f"Flux applied {name}", detail=flux.tails)  # fmt: skip
    for n in names:
        wait_deployment_ready(cluster, namespace, n)
        assert "--kv-cache-dtype" not in deployment_args(cluster, namespace, n)

    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[namespace]).start()
    try:
        # one commit: each gate rollout (examples/gate.yaml's shape) and the args it gates
        change: dict[str, str] = {}
        for n in names:
            gate = rollout(f"{n}-fp8", n, extraArgs=extra[n],
                           promotion={"mode": "gate"})  # fmt: skip
            change[f"gates/{n}/gate.yaml"] = yaml.safe_dump(gate)
            fp8 = copy.deepcopy(deployments[n])
            container = fp8["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [*container["args"], "--kv-cache-dtype", "fp8", *extra[n]]
            change[f"apps/{n}/deployment.yaml"] = yaml.safe_dump(fp8)
        commit = gitea.commit(repo, "main", change, "FP8 KV cache, gated")
        revision = f"main@sha1:{commit}"

        # While the rollouts run, Flux holds both apps: the dependency is not ready
        def held() -> dict[str, Any] | None:
            obj = get(cluster, namespace, "kvr", "good-fp8") or {}
            running = (obj.get("status") or {}).get("phase") in (
                "Preflight",
                "Canary",
                "Evaluating",
            )
            app = ks_ready(cluster, namespace, "good")
            return app if running and "dependency" in app.get("message", "") else None

        app = wait_for(held, 240, "Flux holding the app on the running gate", detail=flux.tails)
        assert (app["status"], app["reason"]) == ("False", "DependencyNotReady"), app
        # Flux's two words for it: the gate not ready, or not yet at this commit (kustomize-
        # controller's same-revision rule: the gate must have applied the app's revision)
        assert app["message"] in (
            f"dependency '{namespace}/gate-good' is not ready",
            f"dependency '{namespace}/gate-good' revision is not up to date",
        ), app
        assert "--kv-cache-dtype" not in deployment_args(cluster, namespace, "good")

        # The open gate: Flux applies the tested args at the gate's revision
        obj = wait_phase(cluster, namespace, "good-fp8", {"AwaitingApproval", "RolledBack",
                         "Failed", "NotNeeded"}, 600)  # fmt: skip
        assert obj["status"]["reason"] == "VerdictReported", obj["status"]
        wait_for(lambda: kustomization_ready(cluster, namespace, "good", revision), 180,
                 "Flux applied the gated args", detail=flux.tails)  # fmt: skip
        assert deployment_args(cluster, namespace, "good")[-4:] == [
            "--kv-cache-dtype",
            "fp8",
            *extra["good"],
        ]

        # The closed gate: production keeps its args; Flux says the gate failed
        obj = wait_phase(cluster, namespace, "bad-fp8", {"AwaitingApproval", "RolledBack",
                         "Failed", "NotNeeded"}, 600)  # fmt: skip
        assert obj["status"]["phase"] == "RolledBack", obj["status"]
        reason = obj["status"]["reason"]

        def gate_failed() -> dict[str, Any] | None:
            gate = ks_ready(cluster, namespace, "gate-bad")
            return gate if gate.get("reason") == "HealthCheckFailed" else None

        # What Flux v1.9.6 shows: the rollout named and kstatus' verdict (from the recipe's
        # `failed` CEL expression over Stalled=True), not kvgate's reason: that is on the rollout
        gate = wait_for(gate_failed, 120, "Flux reporting the closed gate", detail=flux.tails)
        assert gate["status"] == "False", gate
        assert f"[KVCacheRollout/{namespace}/bad-fp8 status: 'Failed']" in gate["message"], gate
        assert gate["message"].startswith("health check failed after "), gate
        app = ks_ready(cluster, namespace, "bad")
        assert (app["status"], app["reason"]) == ("False", "DependencyNotReady"), app
        assert app["message"] == f"dependency '{namespace}/gate-bad' is not ready", app
        assert app["lastAppliedRevision"] == f"main@sha1:{head}", app  # production as it was
        assert "--kv-cache-dtype" not in deployment_args(cluster, namespace, "bad")
        assert reason == "CanaryCrashed", obj["status"]
    finally:
        finish(cluster, operator, [namespace])
