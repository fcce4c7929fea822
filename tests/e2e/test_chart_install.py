"""The Helm chart, installed into the local control plane, runs a rollout to the end.

The operator runs as a pod (the test kubelet runs `kvgate run ...` from the chart's
command and args) with the chart's ServiceAccount credentials, so the RBAC is proven by
use: a missing grant stops the rollout. The namespace enforces Pod Security `restricted`
(the apiserver's PodSecurity admission), so every pod kvgate makes there, the operator's,
both canaries and the eval Job's, is proven admitted by the same run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/kvgate"
EXAMPLES = ROOT / "examples"
TERMINAL = {"Promoted", "RolledBack", "NotNeeded", "Failed"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gsm8k_dir() -> str:
    return os.environ.get("KVGATE_GSM8K_DIR") or str(ROOT.parent / "shared/data/gsm8k")


def wait_for(what: str, probe: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll until `probe()` is truthy; raise with the last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


class Helm:
    def __init__(self, cluster: Any, home: Path) -> None:
        self.bin = str(Path(cluster.bin_dir) / "helm")
        self.env = {
            **os.environ,
            "KUBECONFIG": cluster.kubeconfig,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
}
PROBE_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: sa-probe
spec:
  restartPolicy: Never
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: probe
      image: python:3.11-slim
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
      command:
        - python
        - -c
        - |
          import os, sys
          token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
          sys.exit(0 if os.environ.get("KUBECONFIG") or os.path.exists(token) else 3)
"""


def kubelet_gives_credentials(cluster: Any, namespace: str) -> bool:
    """Whether the test kubelet hands pods ServiceAccount credentials (token mount or KUBECONFIG)."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=PROBE_POD)

    def phase() -> str | None:
        p = get_json(cluster, "pod", "sa-probe", "-n", namespace).get("status", {}).get("phase")
        return p if p in ("Succeeded", "Failed") else None

    done = wait_for("the probe pod", phase, timeout=60, every=0.5)
    cluster.kubectl("delete", "pod", "sa-probe", "-n", namespace, "--wait=false", check=False)
    return done == "Succeeded"


def token_kubeconfig(cluster: Any, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that logs in as `sa` with a TokenRequest token (what a kubelet mounts)."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [
            {
                "name": sa,
                "context": {
                    "cluster": admin["clusters"][0]["name"],
                    "user": sa,
                    "namespace": namespace,
                },
            }
        ],
        "current-context": sa,
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def installed(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[tuple[str, Helm, str]]:
    """The chart installed in `namespace` (Pod Security `restricted`), watching only it, Ready."""
    cluster.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    helm = Helm(cluster, tmp_path / "helm")
    release = f"kvgate-{namespace.rsplit('-', 1)[-1]}"
    values = [
        "--set", "watch.allNamespaces=false",
        "--set", f"watch.namespaces={{{namespace}}}",
        "--set", f"config.gsm8kDir={gsm8k_dir()}",
        "--set", "config.pollInterval=1",
        "--set", "logFormat=plain",
        # The test kubelet bind-mounts volumes over the host filesystem: an emptyDir at /tmp
        # would hide this cluster's pod directories (under pytest's /tmp) from the pod.
        "--set", "writableTmp=false",
        # Ports of their own: pods share the host's port space (on loopback pod IPs).
        "--set", f"health.port={free_port()}",
        "--set", f"metrics.port={free_port()}",
    ]  # fmt: skip
    wait = ["--wait", "--timeout", "180s"]
    native = kubelet_gives_credentials(cluster, namespace)
    proc = helm("install", release, str(CHART), "--namespace", namespace, *values,
                *(wait if native else []))  # fmt: skip
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        notes = proc.stdout
        if not native:
            # This kubelet does not hand out ServiceAccount credentials: give the operator
            # its own SA's token as a kubeconfig, so RBAC is still exercised for real.
            kubeconfig = token_kubeconfig(cluster, namespace, release, tmp_path / "sa.kubeconfig")
            proc = helm("upgrade", release, str(CHART), "--namespace", namespace, *values,
                        "--set", "extraEnv[0].name=KUBECONFIG",
                        "--set", f"extraEnv[0].value={kubeconfig}", *wait)  # fmt: skip
            assert proc.returncode == 0, proc.stdout + proc.stderr
        yield release, helm, notes
    finally:
        if proc.returncode != 0 or os.environ.get("KVGATE_E2E_DEBUG"):
            logs = cluster.kubectl("logs", "-n", namespace, f"deployment/{release}", check=False)
            sys.stderr.write(f"--- operator log\n{logs.stdout[-6000:]}{logs.stderr}\n")
        # Delete the rollouts while the operator still runs, so it releases its finalizers
        # (else the namespace cannot go); then uninstall: cluster-scoped RBAC outlives it.
        cluster.kubectl(
            "delete", "kvr", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90
        )
        helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")


def get_json(cluster: Any, *args: str) -> dict[str, Any]:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def can_i(cluster: Any, sa: str, verb: str, resource: str, namespace: str) -> bool:
    proc = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={sa}", check=False
    )
    return proc.stdout.strip() == "yes"


ROLLOUT = """
apiVersion: kvgate.io/v1alpha1
kind: KVCacheRollout
metadata:
  name: fp8-triton
spec:
  targetRef: {name: vllm}
  kvCacheDtype: fp8
  extraArgs: ["--attention-backend", "TRITON_ATTN"]
  gates:
    capacity: {mode: require, window: 10s, samples: 3}
    accuracy: {questions: 100, chunk: 50, margin: 3}
  canary: {startupTimeout: 5m, evalTimeout: 10m, evalRetries: 1}
  promotion: {mode: auto, verifyWindow: 10s}
"""


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_installed_chart_promotes_a_rollout_under_its_own_service_account(
    cluster: Any, namespace: str, installed: tuple[str, Helm, str]
) -> None:
    release, _, notes = installed
    assert f"kvgate 0.1.0 is installed as {release} in namespace {namespace}" in notes
    assert "kubectl wait kvr/<name> --for=condition=Ready" in notes

    # GIVEN the operator pod, Ready through kopf's health endpoint, under the chart's SA.
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}")
    (pod,) = pods["items"]
    assert pod["spec"]["serviceAccountName"] == release
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    sa = f"system:serviceaccount:{namespace}:{release}"
    assert can_i(cluster, sa, "create", "pods", namespace)
    assert can_i(cluster, sa, "patch", "deployments", namespace)
    assert not can_i(cluster, sa, "create", "pods", "default")  # Role only where it watches
    assert not can_i(cluster, sa, "delete", "deployments", namespace)
    assert not can_i(cluster, sa, "list", "secrets", namespace)

    # AND a simulated production vLLM Deployment under load, itself `restricted` (else its own
    # pods would be refused there; the apiserver warns on its template if it is not).
    labels = get_json(cluster, "namespace", namespace)["metadata"]["labels"]
    assert RESTRICTED.items() <= labels.items()
    proc = cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "vllm-deployment.yaml"))
    assert "PodSecurity" not in proc.stderr, proc.stderr
    cluster.kubectl(
        "rollout", "status", "-n", namespace, "deployment/vllm", "--timeout=180s", timeout=200
    )

    # WHEN a rollout with Triton attention is applied.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=ROLLOUT)

    def finished() -> dict[str, Any] | None:
        obj = get_json(cluster, "kvr", "fp8-triton", "-n", namespace)
        return obj if (obj.get("status") or {}).get("phase") in TERMINAL else None

    obj = wait_for("the rollout to finish", finished, timeout=600, every=2)

    # THEN it is promoted, the Deployment runs FP8 KV, and the status reads as kstatus.
    status = obj["status"]
    assert status["phase"] == "Promoted", status.get("message")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Reconciling"]["status"] == "False"
    assert conditions["Stalled"]["status"] == "False"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    # The README's `kubectl wait` lines work on it.
    for wait in (
        "--for=condition=Reconciling=False",
        "--for=condition=Ready",
        "--for=condition=Promoted",
        "--for=jsonpath={.status.phase}=Promoted",
    ):
        cluster.kubectl("wait", "kvr/fp8-triton", "-n", namespace, wait, "--timeout=10s")
    # AND Argo CD would call it Healthy: the chart's Lua check on the real object (with lupa).
    try:
        from lupa import lua51
    except ImportError:  # not in the dev extra yet; tests/unit/test_argocd_health.py says so
        lua51 = None
    if lua51 is not None:
        lua = lua51.LuaRuntime()
        lua.globals().obj = lua.table_from(obj, recursive=True)
        health = lua.execute((CHART / "argocd/health.lua").read_text())
        assert (health["status"], health["message"]) == (
            "Healthy",
            f"Promoted: {status['message']}",
        )
    deploy = get_json(cluster, "deployment", "vllm", "-n", namespace)
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    events = get_json(
        cluster, "events", "-n", namespace, "--field-selector", "involvedObject.name=fp8-triton"
    )
    reasons = [e["reason"] for e in events["items"]]
    assert "Promoted" in reasons

    # AND Pod Security admitted every pod kvgate made: both canaries and the eval Job's ran
    # (their Events), and no object in the namespace was refused or warned about.
    all_events = get_json(cluster, "events", "-n", namespace)["items"]
    refused = [e["message"] for e in all_events if "PodSecurity" in e.get("message", "")
               or e.get("reason") == "FailedCreate"]  # fmt: skip
    assert refused == [], refused
    made = {e["involvedObject"]["name"] for e in all_events
            if e["involvedObject"].get("kind") == "Pod" and e.get("reason") == "Scheduled"}  # fmt: skip
    assert {"fp8-triton-control", "fp8-triton-candidate"} <= made, sorted(made)
    assert any(n.startswith("fp8-triton-eval") for n in made), sorted(made)
    jobs = {e["involvedObject"]["name"] for e in all_events
            if e["involvedObject"].get("kind") == "Job" and e.get("reason") == "SuccessfulCreate"}  # fmt: skip
    assert any(n.startswith("fp8-triton-eval") for n in jobs), sorted(jobs)

    # AND the operator never hit a permission error.
    logs = cluster.kubectl("logs", "-n", namespace, f"deployment/{release}").stdout
    assert "Forbidden" not in logs and " 403" not in logs
    assert "Traceback" not in logs

    # AND `kvgate report` reads it back from the cluster.
    report = subprocess.run(
        [sys.executable, "-m", "kvgate", "report", "fp8-triton", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[0] == f"KVCacheRollout {namespace}/fp8-triton: Promoted"


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_examples_pass_the_api_servers_validation(cluster: Any, namespace: str) -> None:
    proc = cluster.kubectl("apply", "--server-side", "-f", str(CHART / "crds"), check=False)
    assert proc.returncode == 0, proc.stderr
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/kvcacherollouts.kvgate.io", "--timeout=60s"
    )
    for name in ("auto", "manual", "report", "vllm-deployment"):
        path = EXAMPLES / f"{name}.yaml"
        proc = cluster.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
        )
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
    # The defaults the API server fills in are the ones examples/auto.yaml spells out.
    auto = yaml.safe_load((EXAMPLES / "auto.yaml").read_text())
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
        input=yaml.safe_dump({**auto, "spec": {"targetRef": auto["spec"]["targetRef"]}}),
    )  # fmt: skip
    defaulted = json.loads(proc.stdout)["spec"]
    # Except the windows the example shortens for the simulated production (its comment says
    # so): the defaults are the production values.
    shortened = {
        ("gates", "capacity", "window"): "5m",
        ("gates", "capacity", "samples"): 10,
        ("promotion", "verifyWindow"): "10m",
    }
    example = json.loads(json.dumps(auto["spec"]))
    for path, default in shortened.items():
        *parents, leaf = path
        spelled, filled = example, defaulted
        for key in parents:
            spelled, filled = spelled[key], filled[key]
        assert filled[leaf] == default and spelled[leaf] != default, path
        spelled[leaf] = default
    for key in ("engine", "kvCacheDtype", "canary", "promotion"):
        assert defaulted[key] == example[key], key
    for gate, values in example["gates"].items():
        assert defaulted["gates"][gate] == values, gate
