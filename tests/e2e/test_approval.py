"""Separation of duties on the real control plane: who may approve and abort a rollout.

The chart's approval policies (a MutatingAdmissionPolicy that records identities from the
request, a ValidatingAdmissionPolicy that refuses what it must) are rendered from the chart
with helm and applied; the people are impersonated users (`kubectl --as`) with plain RBAC:

- alice writes rollouts and may patch the Deployments; she is also bound to the approver
  ClusterRole, so her refusal is for being the author, not for a missing verb;
- bob writes rollouts but has no `approve` (or `abort`) verb;
- dave is an approver who may not patch the Deployments;
- carol is an approver who may patch them.

The operator is a `kvgate run` subprocess with KVGATE_APPROVAL_IDENTITY=1 (as the chart sets
it), so it counts only approvals the apiserver recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    CHART,
    TERMINAL,
    Helm,
    Operator,
    container_of,
    get,
    install_crd,
    no_tracebacks,
    rollout,
    rollout_events,
    sim_deployment,
    wait_deployment_ready,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.e2e

ROOM = {"KVGATE_SIM_LOAD": "concurrency=2,prompt=500,output=100"}
TRITON = ["--attention-backend", "TRITON_ATTN"]
GATES = {
    "capacity": {"mode": "off"},
    "accuracy": {"questions": 150, "chunk": 50, "margin": 3},
}


def people(namespace: str, approver_role: str) -> list[dict[str, Any]]:
    def user(name: str) -> dict[str, str]:
        return {"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"}

    def binding(name: str, kind: str, role: str, *users: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [user(u) for u in users],
        }

    def role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": rules,
        }

    rollouts = {"apiGroups": ["kvgate.io"], "resources": ["kvcacherollouts"],
                "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]}  # fmt: skip
    deployments = {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]}
    return [
        role("rollout-author", [rollouts]),
        role("deployer", [deployments]),
        binding("rollout-author", "Role", "rollout-author", "alice", "bob"),
        binding("deployer", "Role", "deployer", "alice", "carol"),
        binding("approver", "ClusterRole", approver_role, "alice", "carol", "dave"),
    ]


def kubectl_as(cluster: Any, who: str, *args: str, input: str | None = None) -> Any:
    return cluster.kubectl(*args, f"--as={who}", input=input, check=False)


def annotate_as(cluster: Any, who: str, ns: str, name: str, *pairs: str) -> Any:
    return kubectl_as(cluster, who, "annotate", "--overwrite", "kvr", name, "-n", ns, *pairs)


def annotations(cluster: Any, ns: str, name: str) -> dict[str, str]:
    return dict(
        ((get(cluster, ns, "kvr", name) or {}).get("metadata") or {}).get("annotations") or {}
    )


@pytest.mark.timeout(900)
def test_only_another_approver_with_the_verb_approves_and_any_approver_aborts(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    release = f"kvgate-{namespace.rsplit('-', 1)[-1]}"
    helm = Helm(cluster, tmp_path / "helm")
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    rendered = helm("template", release, str(CHART), "--namespace", "kvgate-system",
                    "--kube-version", server["gitVersion"],
                    "--set", f"watch.namespaces={{{namespace}}}",
                    "--show-only", "templates/approvalpolicy.yaml")  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    policies = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert {d["kind"] for d in policies} == {
        "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
    }  # fmt: skip
    docs = [*policies, *people(namespace, f"{release}-approver")]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        _run(cluster, namespace, tmp_path)
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false",
                        input=yaml.safe_dump_all(policies), check=False)  # fmt: skip


def _wait_admitting(cluster: Any, ns: str) -> None:
    """Policies take effect a moment after they are created: wait until the author is recorded."""
    probe = rollout("probe", "nothing", promotion={"mode": "manual"})
    probe["metadata"]["annotations"] = {"kvgate.io/created-by": "mallory"}  # overwritten

    def recorded() -> bool:
        kubectl_as(cluster, "bob", "delete", "kvr", "probe", "-n", ns, "--ignore-not-found")
        if kubectl_as(cluster, "bob", "create", "-n", ns, "-f", "-",
                      input=yaml.safe_dump(probe)).returncode != 0:  # fmt: skip
            return False
        return annotations(cluster, ns, "probe").get("kvgate.io/created-by") == "bob"

    wait_for(recorded, 60, "the approval policies to take effect", interval=1.0)
    cluster.kubectl("delete", "kvr", "probe", "-n", ns, "--wait=false")


def _run(cluster: Any, ns: str, tmp_path: Path) -> None:
    _wait_admitting(cluster, ns)
    operator = Operator(cluster, tmp_path / "operator.log", namespaces=[ns],
                        extra_env={"KVGATE_APPROVAL_IDENTITY": "1"}).start()  # fmt: skip
    try:
        for t in ("manual", "abort"):
            cluster.kubectl("apply", "-n", ns, "-f", "-",
                            input=yaml.safe_dump(sim_deployment(t, env=ROOM)))  # fmt: skip
        for t in ("manual", "abort"):
            wait_deployment_ready(cluster, ns, t)
        before = {
            t: container_of(get(cluster, ns, "deployment", t) or {}) for t in ("manual", "abort")
        }
        manual = rollout("manual-fp8", "manual", extraArgs=TRITON, gates=GATES,
                         promotion={"mode": "manual", "verifyWindow": "3s"})  # fmt: skip
        aborted = rollout("abort-fp8", "abort", extraArgs=TRITON, gates=GATES,
                          promotion={"mode": "auto", "verifyWindow": "120s", "verifySamples": 60})  # fmt: skip
        # The author cannot pre-approve, nor name another author, at creation.
        preapproved = {**manual, "metadata": {"name": "manual-fp8",
                       "annotations": {"kvgate.io/approve": "anything"}}}  # fmt: skip
        proc = kubectl_as(cluster, "alice", "create", "-n", ns, "-f", "-",
                          input=yaml.safe_dump(preapproved))  # fmt: skip
        assert proc.returncode != 0 and "alice created this rollout" in proc.stderr, proc.stderr
        for body in (manual, aborted):
            body["metadata"]["annotations"] = {"kvgate.io/created-by": "carol"}
            proc = kubectl_as(cluster, "alice", "create", "-n", ns, "-f", "-",
                              input=yaml.safe_dump(body))  # fmt: skip
            assert proc.returncode == 0, proc.stderr
        assert annotations(cluster, ns, "manual-fp8")["kvgate.io/created-by"] == "alice"

        # --- abort: the auto rollout is stopped while production carries the candidate.
        wait_phase(cluster, ns, "abort-fp8", {"Verifying", *TERMINAL}, 420)
        assert (
            "--kv-cache-dtype"
            in container_of(get(cluster, ns, "deployment", "abort") or {})["args"]
        )
        proc = annotate_as(cluster, "bob", ns, "abort-fp8", "kvgate.io/abort=not mine")
        assert proc.returncode != 0 and "lacks the verb abort" in proc.stderr, proc.stderr
        proc = annotate_as(cluster, "dave", ns, "abort-fp8", "kvgate.io/abort=pager: p99 up")
        assert proc.returncode == 0, proc.stderr
        assert annotations(cluster, ns, "abort-fp8")["kvgate.io/aborted-by"] == "dave"
        end = wait_phase(cluster, ns, "abort-fp8", TERMINAL, 180)["status"]
        assert (end["phase"], end["reason"]) == ("RolledBack", "Aborted"), end
        assert end["message"] == "aborted by dave (kvgate.io/abort: pager: p99 up)"
        assert container_of(get(cluster, ns, "deployment", "abort") or {}) == before["abort"]
        reasons = [r for r, _ in rollout_events(cluster, ns, "abort-fp8", ["PromotionReverted", "Aborted", "RolledBack"])]
        assert {"PromotionReverted", "Aborted", "RolledBack"} <= set(reasons), reasons

        # --- approval: refused for the author, the verb-less and the approver who may not
        # patch the target; a forged record is refused too; carol's approval promotes.
        obj = wait_phase(cluster, ns, "manual-fp8", {"AwaitingApproval", *TERMINAL}, 420)
        status = obj["status"]
        assert (status["phase"], status["reason"]) == ("AwaitingApproval", "AwaitingApproval"), (
            status
        )
        approve = f"kvgate.io/approve={status['configHash']}"
        refusals = {
            "alice": "alice created this rollout and may not approve it",
            "bob": "bob may not approve: it needs the verb approve on kvcacherollouts.kvgate.io",
            "dave": "dave may not patch Deployment manual, so may not approve changing it",
        }
        for who, why in refusals.items():
            proc = annotate_as(cluster, who, ns, "manual-fp8", approve)
            assert proc.returncode != 0 and why in proc.stderr, (who, proc.stderr)
        for forged in ("kvgate.io/approved-by=carol", "kvgate.io/created-by=bob"):
            proc = annotate_as(cluster, "alice", ns, "manual-fp8", forged)
            assert proc.returncode != 0 and "Forbidden" in proc.stderr, (forged, proc.stderr)
        # even an admin cannot write the record by hand: only setting kvgate.io/approve does
        proc = cluster.kubectl("annotate", "kvr", "manual-fp8", "-n", ns,
                               "kvgate.io/approved-by=carol", check=False)  # fmt: skip
        assert proc.returncode != 0, proc.stdout
        assert "kvgate.io/approve" not in annotations(cluster, ns, "manual-fp8")
        assert (get(cluster, ns, "kvr", "manual-fp8") or {})["status"][
            "phase"
        ] == "AwaitingApproval"
        assert container_of(get(cluster, ns, "deployment", "manual") or {}) == before["manual"]

        proc = annotate_as(cluster, "carol", ns, "manual-fp8", approve)
        assert proc.returncode == 0, proc.stderr
        recorded = annotations(cluster, ns, "manual-fp8")
        assert recorded["kvgate.io/approved-by"] == "carol"
        assert recorded["kvgate.io/approved-generation"] == str(obj["metadata"]["generation"])
        done = wait_phase(cluster, ns, "manual-fp8", TERMINAL, 300)["status"]
        assert done["phase"] == "Promoted", done["message"]
        assert (
            "--kv-cache-dtype"
            in container_of(get(cluster, ns, "deployment", "manual") or {})["args"]
        )
        assert (
            "Approved",
            f"approved by carol for config {status['configHash']}",
        ) in rollout_events(cluster, ns, "manual-fp8", ["Approved"])
    finally:
        cluster.kubectl("delete", "kvr", "--all", "-n", ns, "--timeout=60s", check=False)
        code = operator.stop()
        log = operator.log()
        assert no_tracebacks(log) == [], log[-3000:]
        assert code == 0
        # the operator's own writes (finalizers, kopf's annotations) passed the policies
        assert "ValidatingAdmissionPolicy" not in log, log[-3000:]
