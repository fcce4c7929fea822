"""The admission policy docs/security.md gives for the operator's NetworkPolicy rights (defence 9,
security-2.md finding D), applied as written to a real apiserver.

RBAC cannot pin `create`/`delete` on networkpolicies to kvgate's names, so a compromised
operator could delete a namespace's default-deny. The policy in the doc lets the operator's
ServiceAccount create and delete only kvgate's eval and load Jobs' policies. Here a
ServiceAccount with the operator's networkpolicies rights (impersonated) tries both.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import apply, get, policy_binding, wait_for

from kvgate.change import manifests

pytestmark = pytest.mark.e2e

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "security.md"
OPERATOR_SA = "kvgate-operator"


def doc_policy(namespace: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy of docs/security.md, for this test's ServiceAccount."""
    blocks = re.findall(r"```yaml\n(.*?)```", SECURITY_MD.read_text(), re.S)
    (text,) = [b for b in blocks if "kvgate-own-networkpolicies" in b]
    policy: dict[str, Any] = yaml.safe_load(textwrap.dedent(text))
    user = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    for condition in policy["spec"]["matchConditions"]:
        condition["expression"] = condition["expression"].replace(
            "system:serviceaccount:kvgate-system:kvgate", user
        )
    policy["metadata"]["name"] = f"kvgate-own-networkpolicies-{namespace}"
    return policy


def objects(namespace: str) -> list[dict[str, Any]]:
    policy = doc_policy(namespace)
    name = policy["metadata"]["name"]
    binding = policy_binding(name, namespace)
    rights = {  # the operator's networkpolicies rights (tests/unit/test_rbac.py derives them)
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "netpol", "namespace": namespace},
        "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                   "verbs": ["create", "get", "delete"]}],
    }  # fmt: skip
    bound = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "netpol", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "netpol"},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": namespace}],
    }
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_SA}}
    return [policy, binding, rights, bound, sa]


def default_deny(name: str = "default-deny") -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


@pytest.mark.timeout(300)
def test_the_docs_policy_lets_the_operator_touch_only_its_own_policies(
    cluster: Any, namespace: str
) -> None:
    as_operator = f"--as=system:serviceaccount:{namespace}:{OPERATOR_SA}"

    def kubectl(*args: str, input: str | None = None) -> Any:
        return cluster.kubectl(*args, "-n", namespace, as_operator, input=input, check=False)

    setup = objects(namespace)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(setup[:2]))
    apply(cluster, namespace, *setup[2:], default_deny())
    try:
        # The policy takes effect a little after it is made: wait until it refuses.
        refused = "kvgate may only create or delete its own eval and load Jobs' NetworkPolicies"

        def deny_is_refused() -> bool:
            proc = kubectl("delete", "networkpolicy", "default-deny", "--dry-run=server")
            return proc.returncode != 0 and refused in proc.stderr

        wait_for(deny_is_refused, 60, "the admission policy to refuse the operator")
        # the namespace's own policy: not deletable by the operator, still there
        assert kubectl("delete", "networkpolicy", "default-deny").returncode != 0
        assert get(cluster, namespace, "networkpolicy", "default-deny") is not None
        # a policy kvgate did not make cannot be created either (it could cut production off)
        foreign = yaml.safe_dump(default_deny("cut-off"))
        made = kubectl("create", "-f", "-", input=foreign)
        assert made.returncode != 0 and refused in made.stderr, made.stderr
        # kvgate's own eval and load policies: created and deleted
        for role in ("eval", "load"):
            own = manifests.build_eval_network_policy(
                rollout="r", namespace=namespace, canary_port=8000, hub=False, role=role
            )
            made = kubectl("create", "-f", "-", input=yaml.safe_dump(own))
            assert made.returncode == 0, made.stderr
            name = own["metadata"]["name"]
            gone = kubectl("delete", "networkpolicy", name)
            assert gone.returncode == 0, gone.stderr
        # anyone else (here the admin) is not bound by it
        cluster.kubectl("delete", "networkpolicy", "default-deny", "-n", namespace)
    finally:
        for obj in setup[:2]:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"],
                            "--ignore-not-found", check=False)  # fmt: skip
