"""spec.model.tokenSecretRef reaches the eval Job only by opt-in: the operator's
(KVGATE_HUB_TOKEN_SECRETS, the chart's hubTokenSecrets.enabled) and the Secret's
(kvgate.io/hub-token: "true"), checked with the adapter's rule before any Job exists.

The Job gets the token as a `secretKeyRef` the kubelet resolves without kvgate's RBAC, so a
rollout author who may not read Secrets must not be able to name one here (issue 25).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from test_controller import TERMINAL, World

from kvgate.change import manifests
from kvgate.vocabulary import LABEL_ROLLOUT

OPT_IN = {"kvgate.io/hub-token": "true"}
HUB_MODEL = {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "hf", "key": "token"}}
# The long-context task loads the hub tokenizer: the one case the Job is given HF_TOKEN.
LONG_CONTEXT = {"capacity": {"mode": "off"}, "accuracy": {"longContext": {}}}


def world(monkeypatch: pytest.MonkeyPatch, *, enabled: bool) -> World:
    w = World(monkeypatch, model=HUB_MODEL, gates=LONG_CONTEXT)
    w.memo.config = dataclasses.replace(w.memo.config, hub_token_secrets=enabled)
    return w


def referencing(w: World, name: str) -> list[str]:
    return [
        o["metadata"]["name"]
        for kind in ("Pod", "Job")
        for o in w.kube.of_kind(kind)
        if name in manifests.secret_names(o)
    ]


def children(w: World) -> list[str]:
    """The Pods and Jobs kvgate made for the rollout (the production pods are not)."""
    return [
        o["metadata"]["name"]
        for kind in ("Pod", "Job")
        for o in w.kube.of_kind(kind)
        if LABEL_ROLLOUT in (o["metadata"].get("labels") or {})
    ]


def run_watching(w: World, secret: str, steps: int = 300) -> str:
    """Run to the end, asserting after every reconcile that nothing references `secret`."""
    for _ in range(steps):
        delay = w.reconcile()
        assert referencing(w, secret) == [], f"{w.phase}: an object references Secret {secret}"
        if w.phase in TERMINAL:
            return str(w.phase)
        w.now += dt.timedelta(seconds=min(delay, 30))
    raise AssertionError(f"no end: {w.obj.get('status')}")


def test_without_the_operators_opt_in_a_labelled_secret_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(monkeypatch, enabled=False)
    w.kube.add_secret("hf", "hf_token0123456789", OPT_IN)
    assert run_watching(w, "hf") == "Failed"
    status = w.obj["status"]
    assert status["reason"] == "InvalidSpec"
    assert status["message"].startswith("spec.model.tokenSecretRef: ")
    assert "hubTokenSecrets.enabled" in status["message"]
    assert children(w) == []
    w.assert_invariant()


@pytest.mark.parametrize(
    ("labels", "value", "says"),
    [
        (None, "hf_token0123456789", 'kvgate.io/hub-token="true"'),
        ({"kvgate.io/hub-token": "yes"}, "hf_token0123456789", 'kvgate.io/hub-token="true"'),
        (OPT_IN, "hf_token\nsecond-line", "one printable line"),
    ],
    ids=["unlabelled", "label-not-true", "two-lines"],
)
def test_with_the_opt_in_a_secret_that_fails_the_hub_token_rule_is_refused(
    monkeypatch: pytest.MonkeyPatch, labels: dict[str, str] | None, value: str, says: str
) -> None:
    w = world(monkeypatch, enabled=True)
    w.kube.add_secret("hf", value, labels)
    assert run_watching(w, "hf") == "Failed"
    status = w.obj["status"]
    assert status["reason"] == "InvalidSpec"
    assert status["message"].startswith("spec.model.tokenSecretRef: Secret ns/hf ")
    assert says in status["message"]
    assert "hf_token" not in status["message"] and "second-line" not in status["message"]
    assert children(w) == []


def test_a_missing_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(monkeypatch, enabled=True)
    assert run_watching(w, "hf") == "Failed"
    assert w.obj["status"]["reason"] == "InvalidSpec"
    assert "Secret ns/hf (spec.model.tokenSecretRef) does not exist" in w.obj["status"]["message"]


def test_both_opt_ins_give_the_job_the_token_by_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(monkeypatch, enabled=True)
    w.kube.add_secret("hf", "hf_token0123456789", OPT_IN)
    for _ in range(100):
        w.now += dt.timedelta(seconds=min(w.reconcile(), 30))
        if w.kube.of_kind("Job"):
            break
    (job,) = w.kube.of_kind("Job")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    } in env
    # the Job and its pod only, never a canary
    assert sorted(referencing(w, "hf")) == ["r-eval-1", "r-eval-1-x"]


def test_a_label_removed_after_the_start_stops_the_job_and_the_rollout_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(monkeypatch, enabled=True)
    w.kube.add_secret("hf", "hf_token0123456789", OPT_IN)

    def unlabel(w: World) -> None:
        if w.phase == "Canary":  # the Secret passed the check in Pending, then lost the label
            w.kube.secrets["hf"].metadata.labels = {}

    w.before_reconcile = unlabel
    assert run_watching(w, "hf") == "Failed"
    status = w.obj["status"]
    assert status["reason"] == "ExternalErrors"
    assert "spec.model.tokenSecretRef: Secret ns/hf does not opt in" in status["message"]
    assert w.kube.of_kind("Job") == []
    w.assert_invariant()


def test_a_secret_the_operator_may_not_get_is_refused_not_retried() -> None:
    """403 (hubTokenSecrets.names does not list it): a spec problem, not an outage (fail closed)."""
    from types import SimpleNamespace

    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from kvgate.adapters.kube import Kube
    from kvgate.errors import InputError

    def forbidden(name: str, namespace: str) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    kube = Kube(k8s.ApiClient())
    kube.core = SimpleNamespace(read_namespaced_secret=forbidden)  # type: ignore[assignment]
    with pytest.raises(InputError, match=r"^spec.model.tokenSecretRef: the operator may not read"):
        kube.check_hub_token_secret("ns", "other", "token")
