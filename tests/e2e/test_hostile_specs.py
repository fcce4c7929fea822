"""A hostile or careless rollout author, against the real apiserver and operator.

Refused at admission (the CRD's CEL, first wall): LD_PRELOAD, PYTHONPATH, HF_ENDPOINT,
--trust-remote-code, --middleware, canary.evalImage. Refused by the operator (second wall): a
flag that is neither denied nor allowed. Never leaked: a multi-line Secret named as the hub
token, an unlabelled Secret, the operator's own files (/proc/self/environ as the model).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    TERMINAL,
    Operator,
    apply,
    container_of,
    get,
    install_crd,
    no_tracebacks,
    rollout,
    sim_deployment,
    wait_deployment_ready,
    wait_phase,
)

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

    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[namespace]).start()
    try:
        targets = ("unknown", "pem", "unlabelled", "environ")
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
        }  # fmt: skip
        for t, spec in specs.items():
            apply(cluster, namespace, rollout(f"{t}-fp8", t, gates=gates, **spec))
        ends = {t: wait_phase(cluster, namespace, f"{t}-fp8", TERMINAL, 240) for t in targets}

        unknown = ends["unknown"]["status"]
        assert (unknown["phase"], unknown["reason"]) == ("Failed", "InvalidSpec")
        assert "spec.extraArgs" in unknown["message"] and "--enable-lora" in unknown["message"]
        pem = ends["pem"]["status"]["preflight"]["checkpoint"]["finding"]
        assert "pem" in pem  # names the Secret, not its value
        unlabelled = ends["unlabelled"]["status"]["preflight"]["checkpoint"]["finding"]
        assert "kvgate.io/hub-token" in unlabelled
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
