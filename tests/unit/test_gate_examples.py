"""The gate-mode examples: the rollout parses as a gate, and the Flux recipe waits on it."""

from __future__ import annotations

import pathlib

import yaml

from kvgate.model import PromotionMode
from kvgate.spec import RolloutSpec

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
