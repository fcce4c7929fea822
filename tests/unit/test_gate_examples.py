"""The gate-mode examples: the rollout parses as a gate, and the Flux recipe waits on it."""

from __future__ import annotations

import pathlib

import yaml

from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import PromotionMode

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_the_gate_example_is_a_gate_in_an_earlier_argo_cd_wave() -> None:
    obj = yaml.safe_load((EXAMPLES / "gate.yaml").read_text())
    spec = RolloutSpec.from_dict(obj["spec"])
    assert spec.promotion.mode is PromotionMode.GATE
    assert not spec.promotion.mode.changes_deployment
    assert int(obj["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) < 0


def test_the_flux_recipe_applies_the_app_only_after_the_gate() -> None:
    docs = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all((EXAMPLES / "gate-flux.yaml").read_text())
    }
    gate, app = docs["kvgate-gate"], docs["vllm"]
    assert gate["spec"]["wait"] is True
    assert {"name": "kvgate-gate"} in app["spec"]["dependsOn"]
    (check,) = gate["spec"]["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("kvgate.io/v1alpha1", "KVCacheRollout")
    # the conditions the operator writes (conditions.summary_conditions) are the ones it reads
    assert "'Stalled'" in check["failed"] and "'Ready'" in check["current"]
    assert "'Reconciling'" in check["inProgress"]


def test_the_pull_request_example_parses_and_never_changes_the_deployment() -> None:
    obj = yaml.safe_load((EXAMPLES / "pull-request.yaml").read_text())
    spec = RolloutSpec.from_dict(obj["spec"])
    assert spec.promotion.mode is PromotionMode.PULL_REQUEST
    assert not spec.promotion.mode.changes_deployment
    pr = spec.promotion.pull_request
    assert pr is not None and pr.path.endswith(".yaml") and pr.token_secret.name == "forge-token"


def _pull_request_path() -> pathlib.PurePosixPath:
    obj = yaml.safe_load((EXAMPLES / "pull-request.yaml").read_text())
    pr = RolloutSpec.from_dict(obj["spec"]).promotion.pull_request
    assert pr is not None
    return pathlib.PurePosixPath(pr.path)


def test_the_placeholder_is_a_patch_of_the_target_that_sets_nothing() -> None:
    # kvgate replaces it whole; until then it must change nothing (a strategic-merge patch
    # naming the Deployment, no other field)
    target = yaml.safe_load((EXAMPLES / "pull-request.yaml").read_text())["spec"]["targetRef"]
    placeholder = yaml.safe_load((EXAMPLES / "pull-request-placeholder.patch.yaml").read_text())
    assert placeholder == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": target["name"]},
    }
    text = (EXAMPLES / "pull-request-placeholder.patch.yaml").read_text()
    assert (
        f"as the file spec.promotion.pullRequest.path names (here\n# {_pull_request_path()})"
        in text
    )


def test_the_argo_cd_recipe_syncs_the_pull_requests_directory_with_self_heal() -> None:
    app = yaml.safe_load((EXAMPLES / "pull-request-argocd.yaml").read_text())
    obj = yaml.safe_load((EXAMPLES / "pull-request.yaml").read_text())
    pr = obj["spec"]["promotion"]["pullRequest"]
    source = app["spec"]["source"]
    assert source["path"] == str(_pull_request_path().parent)
    assert source["repoURL"].endswith("/" + pr["repository"])
    assert source["targetRevision"] == pr["baseBranch"]
    # kvgate never patches the Deployment in this mode: self-heal is safe, nothing is ignored
    assert app["spec"]["syncPolicy"]["automated"]["selfHeal"] is True
    assert "ignoreDifferences" not in app["spec"]
    assert "argocd.argoproj.io/sync-wave" not in (obj["metadata"].get("annotations") or {})


def test_the_flux_recipe_never_waits_on_the_rollout_it_must_apply_for() -> None:
    # The rollout waits for this Kustomization to apply the merge: waiting on the rollout (or
    # depending on a Kustomization that does) would hold the merge until applyDeadline.
    (app,) = list(yaml.safe_load_all((EXAMPLES / "pull-request-flux.yaml").read_text()))
    spec = app["spec"]
    assert spec["path"] == "./" + str(_pull_request_path().parent)
    assert spec["wait"] is False and "dependsOn" not in spec and "healthCheckExprs" not in spec
    assert [c["kind"] for c in spec["healthChecks"]] == ["Deployment"]
