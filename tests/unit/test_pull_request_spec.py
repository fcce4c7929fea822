"""spec.promotion.pullRequest: what a pullRequest promotion needs, each bad field one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.config import OperatorConfig
from kvgate.errors import SpecError
from kvgate.spec.rollout import RolloutSpec
from kvgate.vocabulary import ForgeProvider, GitFileKind, PromotionMode

CRD = Path(__file__).parents[2] / "crds" / "kvgate.io_kvcacherollouts.yaml"

GOOD: dict[str, Any] = {
    "provider": "gitea",
    "apiUrl": "http://127.0.0.1:3000/api/v1",
    "repository": "ops/serving",
    "path": "apps/vllm/kvgate-patch.yaml",
    "tokenSecretRef": {"name": "forge-token"},
}


def parse(promotion: dict[str, Any]) -> RolloutSpec:
    return RolloutSpec.from_dict({"targetRef": {"name": "vllm"}, "promotion": promotion})


def errors(promotion: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ExceptionGroup) as info:
        parse(promotion)
    out = {}
    for e in info.value.exceptions:
        assert isinstance(e, SpecError)
        out[e.field] = str(e)
    return out


def test_a_full_pull_request_section_parses_with_its_defaults() -> None:
    spec = parse({"mode": "pullRequest", "pullRequest": GOOD})
    pr = spec.promotion.pull_request
    assert spec.promotion.mode is PromotionMode.PULL_REQUEST
    assert not spec.promotion.mode.changes_deployment
    assert pr is not None
    assert pr.provider is ForgeProvider.GITEA
    assert (pr.repository, pr.path, pr.base_branch) == (
        "ops/serving",
        "apps/vllm/kvgate-patch.yaml",
        "main",
    )
    assert pr.kind is GitFileKind.KUSTOMIZE_PATCH
    assert (pr.token_secret.name, pr.token_secret.key) == ("forge-token", "token")
    assert pr.apply_deadline_s == 1800.0


def test_helm_values_takes_a_values_key_and_a_deadline() -> None:
    raw = {**GOOD, "kind": "helmValues", "valuesKey": "vllm.container", "applyDeadline": "1h"}
    pr = parse({"mode": "pullRequest", "pullRequest": raw}).promotion.pull_request
    assert pr is not None
    assert (pr.kind, pr.values_key, pr.apply_deadline_s) == (
        GitFileKind.HELM_VALUES,
        "vllm.container",
        3600.0,
    )


def test_mode_pull_request_without_its_section_names_the_field() -> None:
    assert list(errors({"mode": "pullRequest"})) == ["spec.promotion.pullRequest"]


def test_the_section_in_another_mode_is_refused_not_ignored() -> None:
    found = errors({"mode": "gate", "pullRequest": GOOD})
    assert "only read in mode pullRequest" in found["spec.promotion.pullRequest"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("provider", "bitbucket", "is not one of gitea, github, gitlab"),
        ("apiUrl", "ftp://forge", "http(s) URL"),
        ("apiUrl", "https://user:pw@forge/api", "without credentials"),
        ("repository", "serving", "owner/name"),
        ("repository", "ops/../x", "owner/name"),
        ("path", "../outside.yaml", "relative path"),
        ("path", "/etc/x.yaml", "relative path"),
        ("path", "apps/patch.json", ".yaml or .yml"),
        ("baseBranch", "kvgate/other", "not a branch kvgate may propose to"),
        ("baseBranch", "a..b", "not a branch kvgate may propose to"),
        ("kind", "jsonnet", "kustomizePatch, helmValues"),
        ("applyDeadline", "soon", "duration"),
    ],
)
def test_each_bad_field_is_one_line_naming_it(field: str, value: str, says: str) -> None:
    found = errors({"mode": "pullRequest", "pullRequest": {**GOOD, field: value}})
    assert list(found) == [f"spec.promotion.pullRequest.{field}"]
    assert says in found[f"spec.promotion.pullRequest.{field}"]
    assert "\n" not in found[f"spec.promotion.pullRequest.{field}"]


def test_missing_fields_are_each_named() -> None:
    found = errors({"mode": "pullRequest", "pullRequest": {"provider": "github"}})
    prefix = "spec.promotion.pullRequest."
    assert {prefix + f for f in ("apiUrl", "repository", "path", "tokenSecretRef")} <= set(found)


def test_values_key_goes_with_helm_values_only() -> None:
    helm = errors({"mode": "pullRequest", "pullRequest": {**GOOD, "kind": "helmValues"}})
    assert "required with kind helmValues" in helm["spec.promotion.pullRequest.valuesKey"]
    patch = errors({"mode": "pullRequest", "pullRequest": {**GOOD, "valuesKey": "a.b"}})
    assert "only read with kind helmValues" in patch["spec.promotion.pullRequest.valuesKey"]
    bad = {**GOOD, "kind": "helmValues", "valuesKey": "a..b"}
    assert (
        "dotted key"
        in errors({"mode": "pullRequest", "pullRequest": bad})[
            "spec.promotion.pullRequest.valuesKey"
        ]
    )


def test_the_operator_honours_forge_tokens_only_when_enabled() -> None:
    assert not OperatorConfig.from_env({}).forge_token_secrets
    assert OperatorConfig.from_env({"KVGATE_FORGE_TOKEN_SECRETS": "1"}).forge_token_secrets


def test_the_crd_accepts_the_mode_and_the_section() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    promotion = spec["properties"]["promotion"]
    assert "pullRequest" in promotion["properties"]["mode"]["enum"]
    section = promotion["properties"]["pullRequest"]
    assert set(section["required"]) == {
        "provider",
        "apiUrl",
        "repository",
        "path",
        "tokenSecretRef",
    }
    assert set(section["properties"]) == {
        "provider",
        "apiUrl",
        "repository",
        "baseBranch",
        "path",
        "kind",
        "valuesKey",
        "applyDeadline",
        "tokenSecretRef",
    }
    assert any("pullRequest" in v["rule"] for v in promotion["x-kubernetes-validations"])
