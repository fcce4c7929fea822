"""The eval Job's NetworkPolicy (issue 25): one per rollout, owned by it, created before the Job
and deleted with it; the Job's pod takes no ingress and sends only to the two canary pods'
serving port, DNS, and the hub's HTTPS when the eval downloads from the hub.

The fake cluster does not enforce NetworkPolicy: what is checked here is the object, and its
selectors and ports matched against the pods that exist when the Job runs. Enforcement is shown
on the real node with a policy engine, by tests/harness/test_network_policy.py (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

import pytest
from test_controller import World

from kvgate.change import manifests
from kvgate.vocabulary import ANNOTATION_POLICY_HASH, LABEL_ARM, LABEL_ROLLOUT

DNS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def test_the_object() -> None:
    policy = manifests.build_eval_network_policy(
        rollout="qwen", namespace="llm", canary_port=8000, hub=False
    )
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == "qwen-eval"
    assert policy["metadata"]["namespace"] == "llm"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {LABEL_ROLLOUT: "qwen", LABEL_ARM: "eval"}},
        "policyTypes": ["Ingress", "Egress"],  # Ingress with no rule: nothing comes in
        "egress": [
            {
                "to": [
                    {"podSelector": {"matchLabels": {LABEL_ROLLOUT: "qwen", LABEL_ARM: "control"}}},
                    {"podSelector": {"matchLabels": {LABEL_ROLLOUT: "qwen", LABEL_ARM: "candidate"}}},
                ],
                "ports": [{"protocol": "TCP", "port": 8000}],
            },
            {"ports": DNS},
        ],
    }  # fmt: skip


def test_the_hub_rule_only_when_asked_and_the_hash_follows_the_spec() -> None:
    without = manifests.build_eval_network_policy(
        rollout="qwen", namespace="llm", canary_port=8000, hub=False
    )
    with_hub = manifests.build_eval_network_policy(
        rollout="qwen", namespace="llm", canary_port=8000, hub=True
    )
    assert with_hub["spec"]["egress"][:2] == without["spec"]["egress"]
    assert with_hub["spec"]["egress"][2] == {"ports": [{"protocol": "TCP", "port": 443}]}
    other_port = manifests.build_eval_network_policy(
        rollout="qwen", namespace="llm", canary_port=30000, hub=False
    )
    hashes = {
        p["metadata"]["annotations"][ANNOTATION_POLICY_HASH]
        for p in (without, with_hub, other_port)
    }
    assert len(hashes) == 3
    again = manifests.build_eval_network_policy(
        rollout="qwen", namespace="llm", canary_port=8000, hub=False
    )
    assert again == without  # deterministic: a rerun creates nothing new


def test_a_long_rollout_name_still_gives_a_valid_name() -> None:
    name = manifests.eval_policy_name("r" * 253)
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)


# --- on the fake cluster ---------------------------------------------------------------------


def selects(selector: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """A NetworkPolicy podSelector (matchLabels only, as kvgate writes it) against a pod."""
    assert set(selector) <= {"matchLabels"}, selector
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def until_job(w: World) -> dict[str, Any]:
    for _ in range(100):
        w.reconcile()
        w.now += dt.timedelta(seconds=2)
        if w.kube.of_kind("Job"):
            break
    (job,) = w.kube.of_kind("Job")
    return job


def world(monkeypatch: pytest.MonkeyPatch, *, gsm8k_dir: str | None, **spec: Any) -> World:
    w = World(monkeypatch, **spec)
    w.memo.config = dataclasses.replace(w.memo.config, gsm8k_dir=gsm8k_dir)
    return w


def test_the_policy_selects_the_eval_pod_and_lets_it_reach_only_the_canaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(monkeypatch, gsm8k_dir="/data/gsm8k")
    created: list[str] = []
    w.kube.on_mutation = lambda kube: created.extend(
        k for k in ("NetworkPolicy", "Job") if kube.of_kind(k) and k not in created
    )
    job = until_job(w)
    assert created == ["NetworkPolicy", "Job"]  # the Job's pod never runs unconfined
    (policy,) = w.kube.of_kind("NetworkPolicy")
    pods = w.kube.of_kind("Pod")
    eval_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get("job-name")]
    canaries = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ARM) in
                manifests.ARMS]  # fmt: skip
    production = [p for p in pods if LABEL_ROLLOUT not in (p["metadata"].get("labels") or {})]
    assert len(eval_pods) == 1 and len(canaries) == 2 and production
    spec = policy["spec"]
    assert [p for p in pods if selects(spec["podSelector"], p)] == eval_pods
    assert spec["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in spec
    to_pods, dns = spec["egress"]  # no hub rule: GSM8K is local, no hub tokenizer
    reached = [p for p in pods if any(selects(peer["podSelector"], p) for peer in to_pods["to"])]
    assert sorted(p["metadata"]["name"] for p in reached) == sorted(
        p["metadata"]["name"] for p in canaries
    )
    # the port is the one the Job's command sends to, on both arms
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    urls = [cmd[cmd.index(flag) + 1] for flag in ("--control-url", "--candidate-url")]
    ports = {int(re.match(r"http://[^:/]+:(\d+)/", u)[1]) for u in urls}  # type: ignore[index]
    assert ports == {to_pods["ports"][0]["port"]} == {8000}
    assert dns == {"ports": DNS}
    # owned by the rollout, so deleted with it
    refs = policy["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == [w.obj["metadata"]["uid"]]


@pytest.mark.parametrize(
    ("gsm8k_dir", "gates", "hub"),
    [
        ("/data/gsm8k", {"capacity": {"mode": "off"}}, False),
        (None, {"capacity": {"mode": "off"}}, True),  # GSM8K from the hub dataset
        ("/data/gsm8k", {"capacity": {"mode": "off"},
                         "accuracy": {"longContext": {"tokenizer": "Qwen/Qwen3-8B"}}}, True),
        ("/data/gsm8k", {"capacity": {"mode": "off"},
                         "accuracy": {"longContext": {"tokenizer": "/models/tok"}}}, False),
    ],
)  # fmt: skip
def test_https_to_the_hub_only_when_the_eval_downloads(
    monkeypatch: pytest.MonkeyPatch, gsm8k_dir: str | None, gates: dict[str, Any], hub: bool
) -> None:
    w = world(monkeypatch, gsm8k_dir=gsm8k_dir, gates=gates)
    until_job(w)
    (policy,) = w.kube.of_kind("NetworkPolicy")
    https = {"ports": [{"protocol": "TCP", "port": 443}]}
    assert (https in policy["spec"]["egress"]) is hub


def test_deleted_with_the_eval_jobs_when_the_rollout_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(monkeypatch, gsm8k_dir="/data/gsm8k")
    seen = []
    w.kube.on_mutation = lambda kube: seen.append(bool(kube.of_kind("NetworkPolicy")))
    assert w.run() == "Promoted"
    assert any(seen)
    assert w.kube.of_kind("NetworkPolicy") == [] and w.kube.of_kind("Job") == []


def test_a_policy_that_is_not_the_rollouts_is_left_alone_and_no_job_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(monkeypatch, gsm8k_dir="/data/gsm8k")
    foreign = {"kind": "NetworkPolicy", "metadata": {"name": "r-eval"}, "spec": {"egress": [{}]}}
    w.kube.add(foreign)
    for _ in range(60):
        w.reconcile()
        w.now += dt.timedelta(seconds=2)
    assert w.kube.of_kind("Job") == []
    (policy,) = w.kube.of_kind("NetworkPolicy")
    assert policy["spec"] == {"egress": [{}]}  # not widened, not deleted
    assert "NetworkPolicy r-eval exists and is not this rollout's" in str(w.obj["status"])


def test_an_earlier_runs_policy_is_replaced_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(monkeypatch, gsm8k_dir="/data/gsm8k")
    old = manifests.build_eval_network_policy(
        rollout="r", namespace="ns", canary_port=9999, hub=True
    )
    old["metadata"]["ownerReferences"] = [
        {"uid": w.obj["metadata"]["uid"], "kind": "KVCacheRollout"}
    ]
    w.kube.add(old)
    until_job(w)
    (policy,) = w.kube.of_kind("NetworkPolicy")
    assert policy["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert len(policy["spec"]["egress"]) == 2


def test_a_default_chart_installs_eval_reaches_the_two_canaries_and_dns_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security-2.md finding C: the chart's default config.gsm8kDir is the eval image's copy,
    so a default install's judge opens no HTTPS to any address."""
    from pathlib import Path

    import yaml

    from kvgate.config import OperatorConfig

    values = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "charts/kvgate/values.yaml").read_text()
    )
    default_dir = values["config"]["gsm8kDir"]
    assert default_dir == "/data/gsm8k"
    chart_config = OperatorConfig.from_env({"KVGATE_GSM8K_DIR": default_dir})
    w = world(monkeypatch, gsm8k_dir=chart_config.gsm8k_dir, gates={"capacity": {"mode": "off"}})
    until_job(w)
    (policy,) = w.kube.of_kind("NetworkPolicy")
    meta = w.obj["metadata"]
    only_canaries = manifests.build_eval_network_policy(
        rollout=meta["name"], namespace=meta["namespace"], canary_port=8000, hub=False
    )
    assert policy["spec"]["egress"] == only_canaries["spec"]["egress"]  # canaries:8000, DNS
    assert all("ipBlock" not in peer and "namespaceSelector" not in peer
               for rule in policy["spec"]["egress"] for peer in rule.get("to", []))  # fmt: skip
