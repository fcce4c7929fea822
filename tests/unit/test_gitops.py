"""The file kvgate owns in a GitOps repository (kustomize patch) and its branch name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kvgate.change.gitops import (
    ANNOTATION_VERDICT,
    BRANCH_PREFIX,
    branch_name,
    is_kvgate_branch,
    render_kustomize_patch,
)
from kvgate.errors import SpecError

PREVIOUS: dict[str, Any] = {
    "args": ["serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"],
    "env": [
        {"name": "HF_HOME", "value": "/models"},
        {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"},
        {"name": "OLD_FLAG", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ],
}
CANDIDATE: dict[str, Any] = {
    "args": ["serve", "Qwen/Qwen3-8B", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"],
    "env": [
        {"name": "HF_HOME", "value": "/models"},
        {"name": "VLLM_ATTENTION_BACKEND", "value": "TRITON_ATTN"},
        {"name": "HF_TOKEN", "value": "literal"},
    ],
}


def _container(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    assert document["kind"] == "Deployment"
    containers = document["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _render(**overrides: Any) -> str:
    kwargs: dict[str, Any] = {
        "deployment": "llama",
        "container": "vllm",
        "previous": PREVIOUS,
        "candidate": CANDIDATE,
        "verdict_key": "sha256:0123456789ab",
    }
    kwargs.update(overrides)
    return render_kustomize_patch(**kwargs)


def test_patch_carries_full_args_changed_env_and_the_verdict_annotation() -> None:
    text = _render(namespace="prod")
    document = yaml.safe_load(text)
    assert document["metadata"] == {"name": "llama", "namespace": "prod"}
    template = document["spec"]["template"]
    assert template["metadata"]["annotations"] == {ANNOTATION_VERDICT: "sha256:0123456789ab"}
    container = _container(text)
    assert container["name"] == "vllm"
    assert container["args"] == CANDIDATE["args"]  # the whole atomic list, not the two new flags
    assert "command" not in container  # unchanged command is left to the manifest
    by_name = {e["name"]: e for e in container["env"]}
    assert set(by_name) == {"VLLM_ATTENTION_BACKEND", "HF_TOKEN", "OLD_FLAG"}  # HF_HOME unchanged
    assert by_name["VLLM_ATTENTION_BACKEND"] == {
        "name": "VLLM_ATTENTION_BACKEND",
        "value": "TRITON_ATTN",
    }
    assert by_name["OLD_FLAG"] == {"name": "OLD_FLAG", "$patch": "delete"}
    # valueFrom -> value: the old key is nulled, or a strategic merge would keep both
    assert by_name["HF_TOKEN"] == {"name": "HF_TOKEN", "value": "literal", "valueFrom": None}
    assert text.startswith("# Written by kvgate")


def test_patch_is_deterministic_and_changes_with_the_key() -> None:
    assert _render() == _render()
    assert _render() != _render(verdict_key="sha256:ffffffffffff")


def test_changed_command_is_written_whole_and_a_removed_one_is_nulled() -> None:
    previous = {**PREVIOUS, "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"]}
    candidate = {**CANDIDATE, "command": ["vllm"]}
    assert _container(_render(previous=previous, candidate=candidate))["command"] == ["vllm"]
    removed = _container(_render(previous=previous, candidate=CANDIDATE))
    assert "command" in removed and removed["command"] is None


def test_no_env_change_writes_no_env() -> None:
    candidate = {**CANDIDATE, "env": PREVIOUS["env"]}
    assert "env" not in _container(_render(candidate=candidate))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"deployment": "Llama"}, "spec.target.name"),
        ({"container": "vllm/x"}, "spec.target.container"),
        ({"namespace": "a b"}, "metadata.namespace"),
        ({"verdict_key": "two words"}, "verdict key"),
        ({"candidate": {"args": "--kv-cache-dtype fp8"}}, "candidate.args"),
    ],
)
def test_bad_input_is_one_spec_error_naming_the_field(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        _render(**overrides)
    assert caught.value.field == field


def test_branch_name() -> None:
    assert branch_name("llama-fp8", "0123456789abcdef") == "kvgate/llama-fp8-0123456789abcdef"
    with pytest.raises(SpecError, match=r"metadata\.name"):
        branch_name("../main", "0123456789abcdef")
    with pytest.raises(SpecError, match="configHash"):
        branch_name("llama", "main")


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True),
    st.from_regex(r"[0-9a-f]{16}", fullmatch=True),
)
def test_every_branch_name_is_a_kvgate_branch(rollout: str, config_hash: str) -> None:
    branch = branch_name(rollout, config_hash)
    assert branch.startswith(BRANCH_PREFIX)
    assert is_kvgate_branch(branch)


@pytest.mark.parametrize(
    "branch",
    [
        "main",
        "kvgate/",
        "kvgate",
        "refs/heads/main",
        "kvgate/../main",
        "kvgate/a b",
        "kvgate/x.lock",
    ],
)
def test_other_branches_are_not_kvgate_branches(branch: str) -> None:
    assert not is_kvgate_branch(branch)


def _kubectl() -> str | None:
    for candidate in sorted(Path.home().glob(".cache/kvgate/bin/*/kubectl")):
        return str(candidate)
    return shutil.which("kubectl")


def test_kustomize_applies_the_patch_to_a_base(tmp_path: Path) -> None:
    """The rendered file through real kustomize (kubectl's), as Argo CD and Flux would."""
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("kubectl not built: run hack/build-binaries.sh (kustomize render check)")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama"},
        "spec": {
            "selector": {"matchLabels": {"app": "llama"}},
            "template": {
                "metadata": {"labels": {"app": "llama"}},
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "busybox", "args": ["sleep", "1d"]},
                        {"name": "vllm", "image": "vllm/vllm-openai:v0.23.0", **PREVIOUS},
                    ]
                },
            },
        },
    }
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "kvgate-fp8.patch.yaml").write_text(_render())
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [deployment.yaml]\npatches:\n- path: kvgate-fp8.patch.yaml\n"
    )
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)
    template = rendered["spec"]["template"]
    assert template["metadata"]["annotations"][ANNOTATION_VERDICT] == "sha256:0123456789ab"
    containers = {c["name"]: c for c in template["spec"]["containers"]}
    assert containers["sidecar"]["args"] == ["sleep", "1d"]
    vllm = containers["vllm"]
    assert vllm["image"] == "vllm/vllm-openai:v0.23.0"
    assert vllm["args"] == CANDIDATE["args"]
    assert sorted(vllm["env"], key=lambda e: e["name"]) == sorted(
        CANDIDATE["env"], key=lambda e: e["name"]
    )
