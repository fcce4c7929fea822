"""pullRequest mode end to end: the local control plane, `kvgate run`, and a real Gitea on
127.0.0.1 holding the GitOps repository (a kustomize base with the simulator Deployment).

The test plays the GitOps tool: it applies the repository with `kubectl kustomize` + `kubectl
apply --server-side` under its own field manager, before the rollout and again after merging
kvgate's pull request through the API. The rollout is edited while its first pull request is
open: kvgate closes it with a comment and proposes the new spec in a second one. The rollout must reach Promoted, and the Deployment's
managedFields must show that no one but that field manager (and the Deployment controller's
status) ever wrote it: kvgate never patched the pod template. Then an engine image bump from Git
makes the verdict Stale, and kvgate still writes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    FAST_GATES,
    condition,
    event_reasons,
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from forge import LoopbackGitea

pytestmark = [pytest.mark.e2e, pytest.mark.forge]

PATCH = "apps/sim/kvgate-fp8.patch.yaml"
GITOPS = "gitops-tool"  # the field manager the test applies Git's manifests with


def _render_and_apply(cluster: Any, namespace: str, files: dict[str, str], work: Path) -> None:
    """What Argo CD or Flux does with a commit: render the kustomization, apply it server-side."""
    for path, text in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(work / "apps/sim")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    cluster.kubectl(
        "apply", "--server-side", f"--field-manager={GITOPS}", "--force-conflicts",
        "-n", namespace, "-f", "-", input=rendered,
    )  # fmt: skip


def _template_writers(cluster: Any, namespace: str) -> set[str]:
    """The field managers that wrote the Deployment's pod template (managedFields)."""
    shown = cluster.kubectl(
        "get", "deployment", "sim", "-n", namespace, "-o", "json", "--show-managed-fields"
    )  # fmt: skip
    return {
        m["manager"]
        for m in json.loads(shown.stdout)["metadata"]["managedFields"]
        if m.get("subresource") != "status" and "f:template" in json.dumps(m.get("fieldsV1"))
    }


@pytest.mark.timeout(900)
def test_a_pull_request_rollout_is_promoted_only_through_git(
    cluster: Any, namespace: str, gitea: LoopbackGitea, tmp_path: Path
) -> None:
    install_crd(cluster)
    deployment = sim_deployment(
        "sim", env={"KVGATE_SIM_LOAD": "concurrency=64,prompt=2000,output=400"}
    )
    # The recipe (examples/pull-request-placeholder.patch.yaml): the patch kvgate will own is
    # referenced from the start, as a placeholder that changes nothing, so merging kvgate's pull
    # request is all the GitOps tool has to apply.
    placeholder = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sim"}}
    kustomization = {
        "resources": ["deployment.yaml"],
        "patches": [{"path": "kvgate-fp8.patch.yaml"}],
    }
    base = {
        "apps/sim/deployment.yaml": yaml.safe_dump(deployment),
        "apps/sim/kustomization.yaml": yaml.safe_dump(kustomization),
        PATCH: yaml.safe_dump(placeholder),
    }
    repo = gitea.create_repo("deploy", files=base)
    _render_and_apply(cluster, namespace, base, tmp_path / "v1")
    wait_deployment_ready(cluster, namespace, "sim")

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
        body = rollout("sim-fp8", "sim", **spec)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))

        obj = wait_phase(cluster, namespace, "sim-fp8", {"PullRequestOpen", "RolledBack",
                         "Failed", "NotNeeded"}, 600)  # fmt: skip
        assert obj["status"]["phase"] == "PullRequestOpen", obj["status"].get("message")

        def recorded() -> dict[str, Any] | None:
            status = (get(cluster, namespace, "kvr", "sim-fp8") or {}).get("status") or {}
            pr = status.get("pullRequest") or {}
            return status if pr.get("number") else None

        status = wait_for(recorded, 120, "the pull request recorded")
        first = int(status["pullRequest"]["number"])
        first_branch = status["pullRequest"]["branch"]

        # The rollout is edited while its pull request is open: #first no longer carries what
        # the rollout evaluates, so kvgate closes it, evaluates the new spec, proposes that.
        edited = {**spec, "extraEnv": [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}]}
        body = rollout("sim-fp8", "sim", **edited)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))

        def superseded() -> dict[str, Any] | None:
            pr = gitea.api("GET", f"/repos/{repo}/pulls/{first}").json()
            return pr if pr["state"] == "closed" and not pr.get("merged") else None

        wait_for(superseded, 120, f"pull request #{first} closed by the spec change")
        comments = gitea.api("GET", f"/repos/{repo}/issues/{first}/comments").json()
        assert any("changed (generation 2)" in c["body"] for c in comments), comments
        assert "SpecChanged" in event_reasons(cluster, namespace, "sim-fp8", ["SpecChanged"])

        def proposed_again() -> dict[str, Any] | None:
            status = recorded()
            return status if status and status["pullRequest"]["number"] != first else None

        status = wait_for(proposed_again, 600, "the new spec proposed in a new pull request")
        assert status["runGeneration"] == 2 and status["pullRequest"]["branch"] != first_branch
        number = int(status["pullRequest"]["number"])
        key = status["verdict"]["key"]["digest"]
        branch = status["pullRequest"]["branch"]
        patch = yaml.safe_load(gitea.file(repo, branch, PATCH))
        entry = patch["spec"]["template"]["spec"]["containers"][0]
        assert "--kv-cache-dtype" in entry["args"] and "TRITON_ATTN" in entry["args"]
        assert any(e.get("name") == "VLLM_USE_FLASHINFER_SAMPLER" and e.get("value") == "0"
                   for e in entry.get("env") or []), entry  # fmt: skip
        assert patch["spec"]["template"]["metadata"]["annotations"] == {"kvgate.io/verdict": key}
        # nothing changed in the cluster yet
        live = get(cluster, namespace, "deployment", "sim") or {}
        assert "--kv-cache-dtype" not in live["spec"]["template"]["spec"]["containers"][0]["args"]

        # a person merges; the GitOps tool applies the merge commit
        gitea.merge(repo, number)
        obj = wait_phase(cluster, namespace, "sim-fp8", {"PullRequestMerged"}, 120)
        merge_sha = obj["status"]["pullRequest"]["mergeSha"]
        assert merge_sha == gitea.branch_head(repo, "main")
        files = {p: gitea.file(repo, merge_sha, p) for p in base}  # the merge commit alone
        assert files[PATCH] != base[PATCH]  # kvgate's change replaced the placeholder whole
        _render_and_apply(cluster, namespace, files, tmp_path / "v2")

        obj = wait_phase(cluster, namespace, "sim-fp8", {"Promoted", "Failed"}, 300)
        assert obj["status"]["phase"] == "Promoted", obj["status"].get("message")

        assert _template_writers(cluster, namespace) == {GITOPS}
        fresh = condition(obj, "Stale")
        assert fresh.get("status") in (None, "False"), fresh  # what runs is what was tested

        # An image bump from Git (the GitOps tool applies it): the verdict was reached on the
        # old engine, so it goes Stale (condition, Event, metric); kvgate changes nothing.
        bumped = {**files, "apps/sim/deployment.yaml": files["apps/sim/deployment.yaml"].replace(
            "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.11.1")}  # fmt: skip
        assert bumped != files
        gitea.commit(repo, "main", {"apps/sim/deployment.yaml": bumped["apps/sim/deployment.yaml"]},
                     "bump the engine image")  # fmt: skip
        _render_and_apply(cluster, namespace, bumped, tmp_path / "v3")

        def stale() -> dict[str, Any] | None:
            now = get(cluster, namespace, "kvr", "sim-fp8") or {}
            return now if condition(now, "Stale").get("status") == "True" else None

        obj = wait_for(stale, 120, "Stale=True after the image bump")
        message = condition(obj, "Stale")["message"]
        assert "image vllm/vllm-openai:v0.11.0 -> vllm/vllm-openai:v0.11.1" in message, message
        assert obj["status"]["phase"] == "Promoted"  # the verdict stands; it is only stale
        assert "Stale" in event_reasons(cluster, namespace, "sim-fp8", ["Stale"])
        gauge = f'kvgate_verdict_stale{{name="sim-fp8",namespace="{namespace}"}} 1.0'
        assert gauge in (operator.metrics() or ""), "the stale gauge"
        live = get(cluster, namespace, "deployment", "sim") or {}
        assert live["spec"]["template"]["spec"]["containers"][0]["image"].endswith("v0.11.1")

        assert _template_writers(cluster, namespace) == {GITOPS}  # still only Git wrote it

        log = operator.log()
        assert token not in log
        assert token not in json.dumps(get(cluster, namespace, "kvr", "sim-fp8"))
    finally:
        operator.stop()
