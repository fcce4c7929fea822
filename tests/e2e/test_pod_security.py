"""Pod Security `restricted` for what kvgate creates, as the apiserver's PodSecurity admission
judges it (server-side dry runs in a namespace that enforces `restricted`).

tests/harness/test_real_node.py runs a whole rollout in such a namespace on the real node; here,
on the process kubelet, the chart's literal defaults: the operator's Deployment with its /tmp emptyDir, and the eval Job as the operator
builds it with and without one. The canaries copy the target's pod template: one from a
restricted template is admitted, one from a template that is not is refused, exactly like the
Deployment's own pods would be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import CHART, EXAMPLES, Helm

from kvgate.change import manifests
from kvgate.config import OperatorConfig

pytestmark = pytest.mark.e2e

ENFORCE = "pod-security.kubernetes.io/enforce=restricted"


def dry_run(cluster: Any, namespace: str, obj: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        input=json.dumps(obj), check=False,
    )  # fmt: skip


def as_pod(name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


@pytest.mark.timeout(300)
def test_what_kvgate_creates_passes_restricted(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("label", "namespace", namespace, ENFORCE)
    # The chart's default operator Deployment (a Deployment is not judged, its pods are).
    helm = Helm(cluster, tmp_path / "helm")
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    proc = helm("template", "kvgate", str(CHART), "--namespace", namespace,
                "--kube-version", server["gitVersion"], "--set", f"watch.namespaces={{{namespace}}}",
                "--show-only", "templates/deployment.yaml",
                "--show-only", "templates/serviceaccount.yaml")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(proc.stdout) if d}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(docs["ServiceAccount"]))
    operator = docs["Deployment"]
    assert operator["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]  # the default /tmp
    result = dry_run(cluster, namespace, as_pod("operator", operator["spec"]["template"]["spec"]))
    assert result.returncode == 0, result.stderr

    # The eval Job's pod, as the operator builds it, with the chart's /tmp and without.
    config = OperatorConfig()
    for writable_tmp in (True, False):
        job = manifests.build_eval_job(
            rollout="r", namespace=namespace, attempt=1, image=config.eval_image,
            command=["kvgate", "eval"], env={"KVGATE_GSM8K_DIR": "/data"}, resources={},
            deadline_s=600, config_hash="0123abcd", service_account_name=None,
            nonce="0f1e2d3c4b5a", writable_tmp=writable_tmp,
        )  # fmt: skip
        result = dry_run(cluster, namespace, as_pod("eval", job["spec"]["template"]["spec"]))
        assert result.returncode == 0, (writable_tmp, result.stderr)
        assert dry_run(cluster, namespace, job).returncode == 0

    # The canaries: exactly as restricted as the template they copy.
    restricted = yaml.safe_load((EXAMPLES / "vllm-deployment.yaml").read_text())
    loose = json.loads(json.dumps(restricted))
    del loose["spec"]["template"]["spec"]["securityContext"]
    for template, admitted in ((restricted, True), (loose, False)):
        tpl = template["spec"]["template"]
        (container,) = tpl["spec"]["containers"]
        for arm in manifests.ARMS:
            pod = manifests.build_canary_pod(
                rollout="r", namespace=namespace, arm=arm, template=tpl, container_index=0,
                container=container, config_hash="0123abcd",
            )  # fmt: skip
            result = dry_run(cluster, namespace, pod)
            assert (result.returncode == 0) is admitted, (arm, result.stderr)
            if not admitted:
                assert 'violates PodSecurity "restricted:latest"' in result.stderr
