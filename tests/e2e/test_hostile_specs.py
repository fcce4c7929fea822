"""A hostile or careless rollout author, against the real apiserver and operator.

Refused at admission (the CRD's CEL, first wall): LD_PRELOAD, PYTHONPATH, HF_ENDPOINT,
--trust-remote-code, --middleware, canary.evalImage. Refused by the operator (second wall): a
flag that is neither denied nor allowed. Never leaked: a multi-line Secret named as the hub
token, an unlabelled Secret, the operator's own files (/proc/self/environ as the model).
Never handed on: a Secret the rollout names for the eval Job's HF_TOKEN is used only with the
operator's opt-in (KVGATE_HUB_TOKEN_SECRETS) and the Secret's label; otherwise no Job or Pod
references it, ever.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    TERMINAL,
    Operator,
    apply,
    container_of,
    event_reasons,
    get,
    install_crd,
    no_tracebacks,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

from kvgate.change import manifests

pytestmark = pytest.mark.e2e

PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7kvgateE2E\n"
    "q8pW3xR0yJ5TSECRETLINEk2Zb4nV7cL1mD9sA0fG6hJ8kL3qN5tW2yX4zE\n"
    "-----END PRIVATE KEY-----\n"
)
PLAIN = "hf_plaintokenvaluenotforanyone0123"
ROOM = {"KVGATE_SIM_LOAD": "concurrency=2,prompt=500,output=100"}
TRITON = ["--attention-backend", "TRITON_ATTN"]

ADMISSION: dict[str, tuple[dict[str, Any], str]] = {
    "ld-preload": ({"extraEnv": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}, "extraEnv"),
    "pythonpath": ({"extraEnv": [{"name": "PYTHONPATH", "value": "/tmp"}]}, "extraEnv"),
    "hf-endpoint": (
        {"extraEnv": [{"name": "HF_ENDPOINT", "value": "http://127.0.0.1:1"}]},
        "extraEnv",
    ),
    "remote-code": ({"extraArgs": ["--trust-remote-code"]}, "extraArgs"),
    "middleware": ({"extraArgs": ["--middleware", "evil.Mw"]}, "extraArgs"),
    "eval-image": ({"canary": {"evalImage": "attacker/judge:latest"}}, "evalImage"),
}


def _secret(name: str, value: str, *, opt_in: bool) -> dict[str, Any]:
    labels = {"kvgate.io/hub-token": "true"} if opt_in else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels},
        "data": {"token": base64.b64encode(value.encode()).decode()},
    }


@pytest.mark.timeout(600)
def test_hostile_specs_are_refused_and_leak_nothing(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    # First wall: the apiserver refuses these before any operator sees them.
    for name, (spec, field) in ADMISSION.items():
        body = rollout(f"{name}-fp8", "vllm", **{"extraArgs": TRITON, **spec})
        proc = cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body), check=False
        )
        assert proc.returncode != 0, f"{name} was admitted"
        assert field in proc.stderr, proc.stderr
        assert get(cluster, namespace, "kvr", f"{name}-fp8") is None

    # With the operator's opt-in (the chart's hubTokenSecrets.enabled): the Secret's own label
    # and value rule still refuse.
    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[namespace],
                        extra_env={"KVGATE_HUB_TOKEN_SECRETS": "1"}).start()  # fmt: skip
    try:
        targets = ("unknown", "pem", "unlabelled", "environ", "lc-unlabelled")
        for t in targets:
            apply(cluster, namespace, sim_deployment(t, env=ROOM))
        apply(cluster, namespace, _secret("pem", PEM, opt_in=True))
        apply(cluster, namespace, _secret("plain", PLAIN, opt_in=False))
        for t in targets:
            wait_deployment_ready(cluster, namespace, t)
        before = {t: container_of(get(cluster, namespace, "deployment", t) or {}) for t in targets}
        gates = {"capacity": {"mode": "require", "window": "3s", "samples": 3}}
        specs = {
            # Second wall: not denied by CEL, not on the operator's allowlist.
            "unknown": {"extraArgs": [*TRITON, "--enable-lora"]},
            "pem": {"extraArgs": TRITON,
                    "model": {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "pem"}}},
            "unlabelled": {"extraArgs": TRITON,
                           "model": {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "plain"}}},
            "environ": {"extraArgs": TRITON, "model": {"name": "/proc/self/environ"}},
            # The eval Job would get HF_TOKEN (a hub tokenizer for the long-context task).
            "lc-unlabelled": {"extraArgs": TRITON,
                              "model": {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "plain"}}},
        }  # fmt: skip
        for t, spec in specs.items():
            rollout_gates = LONG_CONTEXT if t == "lc-unlabelled" else gates
            apply(cluster, namespace, rollout(f"{t}-fp8", t, gates=rollout_gates, **spec))
        ends = {t: wait_end_watching(cluster, namespace, f"{t}-fp8", "plain", 240) for t in targets}

        unknown = ends["unknown"]["status"]
        assert (unknown["phase"], unknown["reason"]) == ("Failed", "InvalidSpec")
        assert "spec.extraArgs" in unknown["message"] and "--enable-lora" in unknown["message"]
        # Refused before anything runs (they used to reach the checkpoint scan as a finding).
        pem = ends["pem"]["status"]
        assert (pem["phase"], pem["reason"]) == ("Failed", "InvalidSpec")
        assert "pem" in pem["message"]  # names the Secret, not its value
        assert pem["message"].startswith("spec.model.tokenSecretRef: ")
        for t in ("unlabelled", "lc-unlabelled"):
            unlabelled = ends[t]["status"]
            assert (unlabelled["phase"], unlabelled["reason"]) == ("Failed", "InvalidSpec"), t
            assert "kvgate.io/hub-token" in unlabelled["message"]
            assert unlabelled["message"].startswith("spec.model.tokenSecretRef: Secret ")
            reasons = event_reasons(cluster, namespace, f"{t}-fp8")
            assert "CanaryCreated" not in reasons and "EvalStarted" not in reasons, reasons
        assert_no_reference(cluster, namespace, "plain")
        environ = ends["environ"]["status"]["preflight"]["checkpoint"]["finding"]
        assert "KVGATE_MODEL_DIRS" in environ
        for t in targets:  # nothing reached production
            assert container_of(get(cluster, namespace, "deployment", t) or {}) == before[t]

        # No line of the planted secrets, and nothing of the operator's environment, anywhere a
        # rollout reader (or the operator's log reader) can look.
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        reports = cluster.kubectl("get", "configmaps", "-n", namespace, "-o", "json").stdout
        rollouts = json.dumps([e["status"] for e in ends.values()])
        secret_lines = [line for line in PEM.splitlines() if "-----" not in line] + [PLAIN]
        for where, text in (("events", events), ("reports", reports), ("status", rollouts),
                            ("operator log", operator.log())):  # fmt: skip
            for line in secret_lines:
                assert line not in text, f"{where} holds a line of a planted secret"
            if where != "operator log":
                assert "KUBECONFIG=" not in text and "PATH=/" not in text, where
    finally:
        cluster.kubectl("delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False)
        code = operator.stop()
        assert no_tracebacks(operator.log()) == [], operator.log()[-3000:]
        assert code == 0


LONG_CONTEXT = {"capacity": {"mode": "off"}, "accuracy": {"longContext": {}}}


def assert_no_reference(cluster: Any, namespace: str, secret: str) -> None:
    out = cluster.kubectl("get", "pods,jobs", "-n", namespace, "-o", "json").stdout
    holders = [
        o["metadata"]["name"]
        for o in json.loads(out)["items"]
        if secret in manifests.secret_names(o)
    ]
    assert holders == [], f"{holders} reference Secret {secret}"


def _admission_policy(cluster: Any, namespace: str, policy: str = "token-secret") -> str:
    """The chart's `policy` and its binding, for this namespace, as helm renders them."""
    chart = Path(__file__).resolve().parents[2] / "charts" / "kvgate"
    proc = subprocess.run(
        [str(Path(cluster.bin_dir) / "helm"), "template", "kvgate-hostile", str(chart),
         "--kube-version", "v1.37.2", "--show-only", "templates/admissionpolicy.yaml",
         "--set", f"watch.namespaces={{{namespace}}}"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/kvgate-helm/cache",
             "HELM_CONFIG_HOME": "/tmp/kvgate-helm/config", "HELM_DATA_HOME": "/tmp/kvgate-helm/data"},
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    wanted = [d for d in docs if d["metadata"]["name"] == f"kvgate-hostile-{policy}"]
    assert len(wanted) == 2, [d["metadata"]["name"] for d in docs]
    return yaml.safe_dump_all(wanted)


def _refused_once_in_force(
    cluster: Any, namespace: str, body: dict[str, Any], policy: str, timeout: float
) -> str:
    """kubectl's stderr once the apiserver refuses `body` (an admission policy takes effect
    asynchronously: an apply that got through before is taken back and tried again)."""
    name = body["metadata"]["name"]

    def refused() -> str | None:
        proc = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                               input=yaml.safe_dump(body), check=False)  # fmt: skip
        if proc.returncode == 0:  # the policy is not in force yet: take it back, retry
            cluster.kubectl("delete", "kvr", name, "-n", namespace, check=False)
            return None
        return str(proc.stderr)

    return wait_for(refused, timeout, f"the {policy} admission policy in force")


def wait_end_watching(
    cluster: Any, namespace: str, name: str, secret: str, timeout: float
) -> dict[str, Any]:
    """wait_phase(TERMINAL), checking at every poll that no Pod or Job references `secret`."""

    def ended() -> dict[str, Any] | None:
        assert_no_reference(cluster, namespace, secret)
        obj = get(cluster, namespace, "kvcacherollout", name) or {}
        return obj if (obj.get("status") or {}).get("phase") in TERMINAL else None

    wait_for(ended, timeout, f"{name} ended", interval=1.0)
    return wait_phase(cluster, namespace, name, TERMINAL, 5)


@pytest.mark.timeout(300)
def test_a_token_secret_needs_the_operators_opt_in(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    """The chart's default (hubTokenSecrets.enabled=false): even a labelled Secret is refused."""
    install_crd(cluster)
    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[namespace]).start()
    try:
        apply(cluster, namespace, sim_deployment("lc", env=ROOM))
        apply(cluster, namespace, _secret("labelled", PLAIN, opt_in=True))
        wait_deployment_ready(cluster, namespace, "lc")
        spec = {"extraArgs": TRITON,
                "model": {"name": "Qwen/Qwen3-8B", "tokenSecretRef": {"name": "labelled"}}}  # fmt: skip
        apply(cluster, namespace, rollout("lc-fp8", "lc", gates=LONG_CONTEXT, **spec))
        end = wait_end_watching(cluster, namespace, "lc-fp8", "labelled", 120)
        status = end["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
        assert status["message"].startswith("spec.model.tokenSecretRef: ")
        assert "hubTokenSecrets.enabled" in status["message"] and PLAIN not in status["message"]
        reasons = event_reasons(cluster, namespace, "lc-fp8")
        assert "CanaryCreated" not in reasons and "EvalStarted" not in reasons, reasons
        assert_no_reference(cluster, namespace, "labelled")

        # The chart refuses it at admission too (its ValidatingAdmissionPolicy, rendered here
        # as the chart installs it), and a rollout stored before the policy can still change.
        policy = _admission_policy(cluster, namespace)
        cluster.kubectl("apply", "-f", "-", input=policy)
        again = rollout("lc2-fp8", "lc", gates=LONG_CONTEXT, **spec)
        stderr = _refused_once_in_force(cluster, namespace, again, "token-secret", 30)
        assert "spec.model.tokenSecretRef: this kvgate install does not use hub-token" in stderr
        cluster.kubectl("annotate", "kvr", "lc-fp8", "-n", namespace, "note=still-updatable")
    finally:
        cluster.kubectl("delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False)
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                        "kvgate-hostile-token-secret", "--ignore-not-found", check=False)  # fmt: skip
        code = operator.stop()
        assert no_tracebacks(operator.log()) == [], operator.log()[-3000:]
        assert code == 0


PULL_REQUEST = {
    "mode": "pullRequest",
    "pullRequest": {
        "provider": "gitea", "apiUrl": "http://127.0.0.1:3000/api/v1", "repository": "ops/deploy",
        "path": "apps/lc/kvgate-fp8.patch.yaml", "tokenSecretRef": {"name": "forge-token"},
    },
}  # fmt: skip


@pytest.mark.timeout(180)
def test_a_pull_request_is_refused_at_admission_without_the_forge_opt_in(
    cluster: Any, namespace: str
) -> None:
    """The chart's default (forgeTokenSecrets.enabled=false) reads no forge token, so it refuses
    mode pullRequest at admission: a GitOps sync fails on the apply, not on a Failed rollout.
    Other modes pass, and a pullRequest rollout stored before the policy can still change."""
    install_crd(cluster)
    stored = rollout("stored-pr", "lc", gates=LONG_CONTEXT, promotion=PULL_REQUEST)
    apply(cluster, namespace, stored)  # before the policy (no operator runs: it stays Pending)
    policy = _admission_policy(cluster, namespace, "forge-token")
    try:
        cluster.kubectl("apply", "-f", "-", input=policy)
        fresh = rollout("lc-pr", "lc", gates=LONG_CONTEXT, promotion=PULL_REQUEST)
        stderr = _refused_once_in_force(cluster, namespace, fresh, "forge-token", 60)
        assert "spec.promotion.pullRequest: this kvgate install reads no forge-token" in stderr
        assert "forgeTokenSecrets.enabled=false" in stderr
        assert get(cluster, namespace, "kvcacherollout", "lc-pr") is None
        # gate mode, the GitOps alternative the message names, is admitted
        apply(cluster, namespace, rollout("lc-gate", "lc", gates=LONG_CONTEXT,
                                          promotion={"mode": "gate"}))  # fmt: skip
        # the stored one still takes metadata changes (finalizers, deletion) and spec edits
        cluster.kubectl("annotate", "kvr", "stored-pr", "-n", namespace, "note=still-updatable")
        # switching a stored gate rollout to pullRequest is a new use of the token: refused
        switch = cluster.kubectl(
            "patch", "kvr", "lc-gate", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"promotion": PULL_REQUEST}}), check=False,
        )  # fmt: skip
        assert switch.returncode != 0 and "spec.promotion.pullRequest" in switch.stderr
    finally:
        cluster.kubectl("delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False)
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                        "kvgate-hostile-forge-token", "--ignore-not-found", check=False)  # fmt: skip
